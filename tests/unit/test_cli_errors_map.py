"""The wording and exit code of errors the CLI maps (gitxet/cli/_errors.py)."""

from __future__ import annotations

from gitxet import errors
from gitxet.cli._errors import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE, describe, missing


def test_a_missing_package_names_the_extra() -> None:
    exc = ModuleNotFoundError("No module named 'pyfuse3'", name="pyfuse3")
    msg, code = describe(exc)
    assert code == EXIT_ERROR
    assert msg == "FUSE mounts need pyfuse3: pip install 'gitxet[mount]' (or 'gitxet[all]')"
    msg, _ = describe(ModuleNotFoundError("x", name="uvicorn.config"))
    assert "gitxet[server]" in msg
    msg, _ = describe(ModuleNotFoundError("x", name="google.protobuf"))
    assert "gitxet[csi]" in msg


def test_a_missing_system_library_names_the_system_package() -> None:
    exc = ImportError("libfuse3.so.3: cannot open shared object file", name="pyfuse3")
    msg, code = describe(missing("mount", exc))
    assert code == EXIT_ERROR
    assert msg == "FUSE mounts need pyfuse3: install libfuse3 (apt install fuse3)"


def test_git_failures_hide_the_command_line() -> None:
    msg, code = describe(errors.GitCommandError(["ls-tree", "-r"], 128, "fatal: bad tree"))
    assert (msg, code) == ("git: bad tree", EXIT_ERROR)
    msg, code = describe(errors.GitObjectNotFoundError("nosuch"))
    assert (msg, code) == ("not found: no revision or object named 'nosuch'", EXIT_NOT_FOUND)
    msg, code = describe(errors.NotARepositoryError("/tmp"))
    assert code == EXIT_USAGE and msg.startswith("not a git repository: /tmp")


def test_unreachable_servers_are_named_without_credentials() -> None:
    exc = errors.UnreachableError("discovery", "http://u:pw@h:1/x.git", "connection refused")
    msg, code = describe(exc)
    assert code == EXIT_ERROR and "pw" not in msg
    assert msg.startswith("cannot reach http://h:1/x.git (connection refused)")


def test_data_behind_an_unreachable_remote_is_not_called_missing() -> None:
    gone = errors.UnreachableError("discovery", "http://u:pw@h:1/x.git", "connection refused")
    exc = errors.DataUnavailableError(
        "ab" * 32,
        [("store", "does not have it"), ("origin http://h:1/x.git", "cannot reach")],
        [gone],
        path="a.bin",
    )
    msg, code = describe(exc)
    assert code == EXIT_ERROR and msg.startswith("no store or remote has the data of a.bin")
    exc = errors.DataUnavailableError("ab" * 32, [("origin /x.git", "does not have it")])
    msg, code = describe(exc)
    assert code == EXIT_NOT_FOUND and msg.startswith("not found: ")
    # the remote lacks it: what to run (where the data is) is said
    assert "origin /x.git: does not have it" in msg and msg.endswith("git xet push --all")
