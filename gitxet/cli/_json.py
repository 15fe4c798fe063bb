"""The ``--json`` outputs: one JSON Schema per output, the one place that defines their keys.

``docs/cli.md`` lists these schemas (generated) and the tests validate every ``--json``
output of the CLI against them, so a key cannot change silently. Listings (``ls-files``,
``mounts``, ``hash``) print one object per line (JSON Lines); everything else prints one
object.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from gitxet.settings import TOKEN_ENV

_STR = {"type": "string"}
_INT = {"type": "integer", "minimum": 0}
_BOOL = {"type": "boolean"}
_NULL_STR = {"type": ["string", "null"]}
_NULL_INT = {"type": ["integer", "null"], "minimum": 0}
_NULL_BOOL = {"type": ["boolean", "null"]}
_HEX = {"type": "string", "pattern": "^[0-9a-f]{64}$"}


def _obj(props: dict[str, Any], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
        "additionalProperties": False,
    }


def _list(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


_FILE = _obj(
    {
        "path": _STR,
        "size": _INT,
        "xet_hash": _HEX,
        "sha256": _HEX,
        "materialized": _NULL_BOOL,
        "deleted": _BOOL,
    }
)

#: output name -> (what it describes, its JSON Schema, JSON Lines?)
SCHEMAS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "ls-files": ("`git xet ls-files --json`: one line per pointer file", _FILE, True),
    "hash": (
        "`git xet hash --json`: one line per file",
        _obj({"path": _STR, "hash": _HEX, "size": _INT, "chunks": _INT}),
        True,
    ),
    "mounts": (
        "`git xet mounts --json`: one line per mount (a dead mount without a record has only "
        "mountpoint, state, commit and fix); `commit` is the commit served now, `watch` the "
        "branch a watched mount follows",
        _obj(
            {
                "mountpoint": _STR,
                "state": {"enum": ["ok", "dead", "hung", "orphan", "absent"]},
                "pid": _INT,
                "supervisor_pid": _NULL_INT,
                "kind": {"enum": ["fuse", "nfs"]},
                "repo": _STR,
                "commit": _STR,
                "subdir": _STR,
                "data": {"enum": ["chunk cache", "local store"]},
                "cache_dir": _NULL_STR,
                "cache_bytes": _NULL_INT,
                "log": _STR,
                "metrics": _NULL_STR,
                "watch": _NULL_STR,
                "fix": _STR,
                "stats": {
                    "oneOf": [
                        {"type": "null"},
                        _obj(
                            {
                                k: {"type": "number", "minimum": 0}
                                for k in (
                                    "read_bytes",
                                    "reads",
                                    "read_errors",
                                    "cache_hits",
                                    "cache_misses",
                                    "fetched_bytes",
                                )
                            }
                        ),
                    ]
                },
            },
            optional=(
                "pid",
                "supervisor_pid",
                "kind",
                "repo",
                "subdir",
                "data",
                "cache_dir",
                "cache_bytes",
                "log",
                "metrics",
                "watch",
                "stats",
            ),
        ),
        True,
    ),
    "status": (
        "`git xet status --json`",
        _obj(
            {
                "branch": _NULL_STR,
                "commit": _NULL_STR,
                "remote": {"oneOf": [{"type": "null"}, _obj({"name": _STR, "url": _STR})]},
                "pointer_files": _obj({"total": _INT, "materialized": _INT, "pointers": _INT}),
                "pointers": _list(_obj({"path": _STR, "size": _INT})),
                "changes": _list(
                    _obj(
                        {
                            "path": _STR,
                            "staged": {"enum": [None, "A", "M", "D", "T"]},
                            "unstaged": {"enum": [None, "A", "M", "D", "T"]},
                        }
                    )
                ),
                "to_push": _list(_STR),
                "unpushed_data": _NULL_INT,
            }
        ),
        False,
    ),
    "pointer": (
        "`git xet pointer --json`",
        _obj(
            {
                "pointer": _STR,
                "sha256": _HEX,
                "size": _INT,
                "xet_hash": _HEX,
                "matches": _NULL_BOOL,
            }
        ),
        False,
    ),
    "env": (
        "`git xet env --json` (`repository` is null outside a repository)",
        _obj(
            {
                "version": _STR,
                "chunker": _STR,
                "python": _STR,
                "terminal_progress": _BOOL,
                "cache_dir": _STR,
                "cache_size": _INT,
                "state_dir": _STR,
                "variables": {"type": "object", "additionalProperties": _NULL_STR},
                "repository": {
                    "oneOf": [
                        {"type": "null"},
                        _obj(
                            {
                                "path": _STR,
                                "store": _STR,
                                "threshold": _INT,
                                "threshold_source": _STR,
                                "lazy": _BOOL,
                                "default_remote": _NULL_STR,
                                "remotes": _list(
                                    _obj(
                                        {
                                            "name": _STR,
                                            "url": _STR,
                                            "cas": _NULL_STR,
                                            "token": {
                                                "enum": [
                                                    None,
                                                    "none",
                                                    "option",
                                                    "token file",
                                                    TOKEN_ENV,
                                                    "keyring",
                                                    "url",
                                                ]
                                            },
                                        }
                                    )
                                ),
                                "config": {"type": "object", "additionalProperties": _NULL_STR},
                                "xorbs": _INT,
                                "xorb_bytes": _INT,
                                "shards": _INT,
                            }
                        ),
                    ]
                },
            }
        ),
        False,
    ),
    "add": (
        "`git xet add --json`",
        _obj({"files": _INT, "new_bytes": _INT, "reused_bytes": _INT}),
        False,
    ),
    "fetch": (
        "`git xet fetch --json`",
        _obj(
            {
                "files": _INT,
                "bytes": _INT,
                "already_local": _INT,
                "fetched_files": _INT,
                "xorbs_fetched": _INT,
                "bytes_fetched": _INT,
            }
        ),
        False,
    ),
    "push": (
        "`git xet push --json` (printed before git push runs)",
        _obj(
            {
                "remote": _STR,
                "dry_run": _BOOL,
                "files": _INT,
                "xorbs_uploaded": _INT,
                "shards_uploaded": _INT,
                "bytes_uploaded": _INT,
                "xorbs_already_there": _INT,
                "missing": _list(_STR),
            }
        ),
        False,
    ),
    "migrate-info": (
        "`git xet migrate info --json` and `git xet migrate --dry-run --json`",
        _obj(
            {
                "refs": _list(_STR),
                "commits": _INT,
                "threshold": _INT,
                "extensions": _list(
                    _obj(
                        {
                            "extension": _STR,
                            "lfs_files": _INT,
                            "lfs_bytes": _INT,
                            "plain_files": _INT,
                            "plain_bytes": _INT,
                        }
                    )
                ),
                "lfs_missing": _INT,
            }
        ),
        False,
    ),
    "prune": (
        "`git xet prune --json`",
        _obj(
            {
                "dry_run": _BOOL,
                "shards_removed": _INT,
                "xorbs_removed": _INT,
                "bytes_removed": _INT,
                "files_removed": _INT,
                "shards_kept": _INT,
                "xorbs_kept": _INT,
                "bytes_kept": _INT,
                "kept_files": _obj(
                    {"checkout": _INT, "recent": _INT, "unpushed": _INT, "mounted": _INT}
                ),
                "not_on_remote": _NULL_INT,
                "cache_ranges_removed": _NULL_INT,
                "cache_bytes_removed": _NULL_INT,
            }
        ),
        False,
    ),
    "prune-cache": (
        "`git xet prune --cache --json` outside a repository",
        _obj({"dry_run": _BOOL, "ranges": _INT, "bytes": _INT}),
        False,
    ),
}


def emit(kind: str, obj: dict[str, Any]) -> None:
    """Print ``obj`` as one line of JSON on stdout (``kind`` names its schema)."""
    assert kind in SCHEMAS, kind
    typer.echo(json.dumps(obj, ensure_ascii=False))


def documentation() -> list[str]:
    """The "JSON output" section of docs/cli.md (markdown lines)."""
    out = [
        "",
        "## JSON output",
        "",
        "`--json` prints machine-readable output on stdout with stable keys; messages stay on",
        "stderr. Listings print one object per line (JSON Lines), the other commands one",
        "object. The schemas below (JSON Schema) are what the tests validate each output",
        "against; a key is only ever added, never renamed or removed, without a major version.",
    ]
    for name, (what, schema, _) in SCHEMAS.items():
        out += ["", f"### {name}", "", what + ":", "", "```json"]
        out += json.dumps(schema, indent=2).splitlines()
        out += ["```"]
    return out
