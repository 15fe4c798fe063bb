"""Map gitxet errors to one clear line on stderr and an exit code (never a traceback)."""

from __future__ import annotations

import sys
from typing import NoReturn

from gitxet import errors

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTEGRITY = 3
EXIT_NOT_FOUND = 4
EXIT_AUTH = 5


def describe(exc: BaseException) -> tuple[str, int]:
    """A one-line message and exit code for an exception (URL credentials removed)."""
    from gitxet.settings import redact

    msg, code = _describe(exc)
    return redact(msg), code


def _describe(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, errors.IntegrityError):
        return f"integrity error: {exc} (the data is corrupt or was tampered with)", EXIT_INTEGRITY
    if isinstance(exc, errors.MaterializeError):
        path, cause = exc.failures[0]
        msg, code = describe(cause)
        more = len(exc.failures) - 1
        if not isinstance(cause, errors.UnsafePathError):  # that one names its path itself
            msg = f"{path}: {msg}"
        return msg + (f" (and {more} more file(s) failed)" if more else ""), code
    if isinstance(exc, errors.AuthError):
        return f"access denied: {exc}", EXIT_AUTH
    if isinstance(exc, errors.DataUnavailableError):
        # every remote was asked; the exit status tells the worst reason one of them gave
        codes = {describe(c)[1] for c in exc.causes}
        code = next((c for c in (EXIT_INTEGRITY, EXIT_AUTH) if c in codes), EXIT_NOT_FOUND)
        return f"not found: {exc}", code
    if isinstance(exc, errors.NotFoundError):
        return f"not found: {exc}", EXIT_NOT_FOUND
    if isinstance(exc, errors.FormatError):
        return f"malformed data: {exc}", EXIT_ERROR
    if isinstance(exc, errors.MountError) and exc.log_tail.strip():
        last = exc.log_tail.strip().splitlines()[-1].removeprefix("git-xet: ")
        return f"{exc}: {last}", EXIT_ERROR
    if isinstance(exc, errors.GitxetError):
        return str(exc), EXIT_ERROR
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename or exc.strerror or exc}", EXIT_NOT_FOUND
    if isinstance(exc, IsADirectoryError):
        return f"is a directory: {exc.filename}", EXIT_ERROR
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}", EXIT_ERROR
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}", EXIT_ERROR
    return f"internal error: {type(exc).__name__}: {exc}", EXIT_ERROR


def fail(exc: BaseException) -> NoReturn:
    """Print ``git-xet: <message>`` and exit with the mapped code."""
    msg, code = describe(exc)
    print(f"git-xet: {msg}", file=sys.stderr)
    raise SystemExit(code)
