"""Small versioned JSON state records (mount registry, plugin state), parsed strictly.

State files are written by us but read after crashes, upgrades and hand edits, so a reader
accepts exactly one shape: a JSON object with the expected ``version``, every field
present with its type, and nothing else. Anything else is a :class:`FormatError` naming
the defect, never a half-understood record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gitxet.errors import FormatError

Types = Mapping[str, type | tuple[type, ...]]


def parse_record(
    data: bytes, what: str, *, version: int, types: Types, max_bytes: int = 64 * 1024
) -> dict[str, Any]:
    """The fields of a record (``version`` left out); raises :class:`FormatError`."""
    return check_record(
        load_json_object(data, what, max_bytes=max_bytes), what, version=version, types=types
    )


def load_json_object(data: bytes, what: str, *, max_bytes: int = 64 * 1024) -> dict[str, Any]:
    """``data`` as a JSON object of at most ``max_bytes``; raises :class:`FormatError`."""
    if len(data) > max_bytes:
        raise FormatError(what, f"larger than {max_bytes} bytes")
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(what, f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise FormatError(what, "not a JSON object")
    return body


def check_record(body: Any, what: str, *, version: int, types: Types) -> dict[str, Any]:
    """Check a decoded record: an object with ``version`` and exactly ``types``' fields.

    Returns the fields (a copy, ``version`` left out); raises :class:`FormatError`.
    """
    if not isinstance(body, dict):
        raise FormatError(what, "not a JSON object")
    if body.get("version") != version:
        raise FormatError(what, f"unsupported version {body.get('version')!r}")
    extra = set(body) - set(types) - {"version"}
    if extra:
        raise FormatError(what, f"unknown fields {sorted(extra)}")
    for key, allowed in types.items():
        if key not in body:
            raise FormatError(what, f"missing field {key!r}")
        value = body[key]
        wants_bool = allowed is bool or (isinstance(allowed, tuple) and bool in allowed)
        # bool is an int subclass: True is never a pid or a size (unless a bool is wanted)
        if (isinstance(value, bool) and not wants_bool) or not isinstance(value, allowed):
            raise FormatError(what, f"field {key!r} has the wrong type")
    return {k: v for k, v in body.items() if k != "version"}
