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


# The optional parts of gitxet: extra -> ("<feature> need(s)", modules it imports, system package a
# module needs at import time). ``pip install 'gitxet[all]'`` installs every extra.
EXTRAS: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    "mount": (
        "FUSE mounts need",
        ("pyfuse3", "trio", "prometheus_client"),
        "libfuse3 (apt install fuse3)",
    ),
    "server": ("the server needs", ("starlette", "uvicorn", "boto3"), None),
    "csi": ("the CSI plugin needs", ("grpc", "google.protobuf"), None),
}


def _extra_of(module: str) -> str | None:
    top = module.split(".")[0]
    for extra, (_, modules, _) in EXTRAS.items():
        if any(m.split(".")[0] == top for m in modules):
            return extra
    return None


def missing(extra: str, exc: ImportError) -> errors.MissingDependencyError:
    """The error for an import of ``extra`` that failed: the package is absent, or it is
    there and a system library it loads is not (libfuse3 for pyfuse3)."""
    feature, modules, system = EXTRAS[extra]
    name = exc.name or modules[0]
    if isinstance(exc, ModuleNotFoundError):
        return errors.MissingDependencyError(feature, name, extra, None)
    return errors.MissingDependencyError(feature, name, None, system or str(exc))


def require(extra: str, *, load: bool = True) -> None:
    """Import what ``extra`` provides, or fail with one line naming what to install.

    ``load=False`` only checks that the modules are installed, without importing them (a
    process that starts the one using them: the system library a module loads is then
    checked, and reported, by that process).
    """
    import importlib
    import importlib.util

    for module in EXTRAS[extra][1]:
        try:
            if load:
                importlib.import_module(module)
            elif importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        except ImportError as exc:
            raise missing(extra, exc) from None


def describe(exc: BaseException) -> tuple[str, int]:
    """A one-line message and exit code for an exception (URL credentials removed)."""
    from gitxet.settings import redact
    from gitxet.util.shown import one_line, shortened

    msg, code = _describe(exc)
    # a hostile tree's path: no newline, no escape codes; a 100 KB argument: not all of it
    return shortened(one_line(redact(msg))), code


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
    if isinstance(exc, errors.UnreachableError):
        return (
            f"cannot reach {exc.url} ({exc.reason}): is the server running and the URL right?",
            EXIT_ERROR,
        )
    if isinstance(exc, errors.NotARepositoryError):
        return (
            f"not a git repository: {exc.path} (run this inside one: 'git init' makes one, "
            "'git xet init' then sets it up)",
            EXIT_USAGE,
        )
    if isinstance(exc, errors.GitObjectNotFoundError):
        return f"not found: no revision or object named {exc.name!r}", EXIT_NOT_FOUND
    if isinstance(exc, errors.GitCommandError):
        said = exc.stderr.removeprefix("fatal: ").removeprefix("error: ")
        return f"git: {said or 'failed'}", EXIT_ERROR
    if isinstance(exc, errors.MissingDependencyError):
        if exc.extra:
            how = f"pip install 'gitxet[{exc.extra}]' (or 'gitxet[all]')"
        else:
            how = f"install {exc.system}"
        return f"{exc.feature} {exc.module}: {how}", EXIT_ERROR
    if isinstance(exc, errors.DataUnavailableError):
        # every remote was asked; the exit status tells the worst reason one of them gave:
        # bad data (3), a refused token (5), a server that could not be reached (1: the data
        # may well be there), else "not found" (4)
        codes = {describe(c)[1] for c in exc.causes}
        unreachable = any(isinstance(c, errors.UnreachableError) for c in exc.causes)
        code = next((c for c in (EXIT_INTEGRITY, EXIT_AUTH) if c in codes), EXIT_NOT_FOUND)
        if code == EXIT_NOT_FOUND and unreachable:
            code = EXIT_ERROR
        if code != EXIT_NOT_FOUND:
            return str(exc), code
        # every remote answered that it lacks the data: say how it gets there
        how = "; a clone that has the data uploads it: git xet push --all" if exc.tried else ""
        return f"not found: {exc}{how}", code
    if isinstance(exc, errors.NotFoundError):
        return f"not found: {exc}", EXIT_NOT_FOUND
    if isinstance(exc, errors.FormatError):
        return f"malformed data: {exc}", EXIT_ERROR
    if isinstance(exc, errors.MountError) and exc.log_tail.strip():
        last = exc.log_tail.strip().splitlines()[-1].removeprefix("git-xet: ")
        return f"{exc}: {last}", EXIT_ERROR
    if isinstance(exc, errors.GitxetError):
        return str(exc), EXIT_ERROR
    if isinstance(exc, ImportError) and exc.name and _extra_of(exc.name):
        return describe(missing(_extra_of(exc.name) or "", exc))
    if isinstance(exc, FileNotFoundError):
        if exc.filename is None:  # its message names what is missing ('/x: no such file')
            return f"not found: {exc.strerror or exc}", EXIT_NOT_FOUND
        return f"no such file: {exc.filename}", EXIT_NOT_FOUND
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
