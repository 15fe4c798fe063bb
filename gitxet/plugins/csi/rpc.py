"""What every CSI call goes through: redacted logging, and errors turned into gRPC statuses.

Secrets never reach a log line: fields the proto marks ``csi_secret`` (the ``secrets`` maps)
are logged as their key names only, and ``mount_flags`` (which the spec says may carry
sensitive values) as a count. Messages sent back to the caller are scrubbed of the request's
secret values too, in case a lower layer quoted one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc

from gitxet.plugins.csi import csi_pb2
from gitxet.plugins.csi.volumes import CsiRequestError

log = logging.getLogger("gitxet.plugins.csi")

T = TypeVar("T")
_REDACTED_FIELDS = frozenset({"mount_flags"})
_MAX_LOGGED_VALUE = 512
_MIN_SCRUBBED = 4


def _is_secret(field: Any) -> bool:
    return bool(field.GetOptions().Extensions[csi_pb2.csi_secret])


def describe(message: Any) -> str:
    """A one-line rendering of a protobuf message with every secret value left out."""
    parts = []
    for field, value in message.ListFields():
        name = field.name
        if _is_secret(field):
            keys = sorted(value.keys()) if hasattr(value, "keys") else []
            parts.append(f"{name}=<redacted keys {keys}>")
        elif name in _REDACTED_FIELDS:
            parts.append(f"{name}=<{len(value)} redacted>")
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            shown = {k: _short(str(v)) for k, v in sorted(value.items())}
            parts.append(f"{name}={shown}")
        elif field.message_type is not None:
            if _repeated(field):
                parts.append(f"{name}=[{', '.join(describe(v) for v in value)}]")
            else:
                parts.append(f"{name}={{{describe(value)}}}")
        elif field.enum_type is not None:
            parts.append(f"{name}={field.enum_type.values_by_number[value].name}")
        else:
            parts.append(f"{name}={_short(repr(value))}")
    return " ".join(parts)


def _repeated(field: Any) -> bool:
    # protobuf 6 added FieldDescriptor.is_repeated; 7 dropped the older ``label``.
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return bool(field.label == field.LABEL_REPEATED)


def _describe_safely(message: Any) -> str:
    try:
        return describe(message)
    except Exception as exc:  # a log line must never fail the call
        return f"<cannot describe {type(message).__name__}: {type(exc).__name__}>"


def _short(text: str) -> str:
    return text if len(text) <= _MAX_LOGGED_VALUE else text[:_MAX_LOGGED_VALUE] + "..."


def secret_values(message: Any) -> list[str]:
    """Secret values in ``message`` (top-level ``csi_secret`` maps) to scrub, longest first.

    Values shorter than 4 characters (after stripping) are left out: replacing them would
    mangle every message, and no real token is that short.
    """
    out: list[str] = []
    for field, value in message.ListFields():
        if _is_secret(field) and hasattr(value, "values"):
            out.extend(v for v in value.values() if len(v.strip()) >= _MIN_SCRUBBED)
    return sorted(out, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret value replaced by ``***``."""
    for value in secrets:
        if value:
            text = text.replace(value, "***")
    return text


def handle(method: str, request: Any, context: Any, fn: Callable[[], T]) -> T:
    """Run one RPC: log it (redacted), map :class:`CsiRequestError` to its status code.

    Anything else escaping ``fn`` is a bug or an environment failure: it is logged with its
    type and answered with INTERNAL, never with a traceback to the caller. Calls and their
    success are logged at DEBUG (kubelet republishes every volume each sync period and the
    sidecars probe every few seconds); failures at WARNING, and what a call changed is
    logged by the service at INFO.
    """
    secrets = secret_values(request)
    started = time.monotonic()
    log.debug("%s %s", method, _describe_safely(request))
    try:
        result = fn()
    except CsiRequestError as exc:
        msg = scrub(exc.message, secrets)
        log.warning(
            "%s failed after %.2fs: %s: %s", method, time.monotonic() - started, exc.code, msg
        )
        context.abort(getattr(grpc.StatusCode, exc.code), msg)
        raise AssertionError("unreachable: context.abort raises") from None
    except Exception as exc:
        msg = scrub(f"{type(exc).__name__}: {exc}", secrets)
        took = time.monotonic() - started
        log.error("%s failed after %.2fs: internal error: %s", method, took, msg)
        context.abort(grpc.StatusCode.INTERNAL, f"internal error: {msg}")
        raise AssertionError("unreachable: context.abort raises") from None
    log.debug("%s ok in %.2fs", method, time.monotonic() - started)
    return result
