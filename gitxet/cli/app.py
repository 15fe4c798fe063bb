"""The ``git-xet`` command (``git xet ...``): assembly of the command groups only."""

from __future__ import annotations

import inspect
import os
import sys
from typing import Annotated, NoReturn

import typer

import gitxet
from gitxet.cli import (
    _errors,
    _interrupt,
    completion,
    csi,
    gitcmds,
    hooks,
    inspection,
    logs,
    migrate,
    mountcmds,
    plugins,
    plumbing,
    prune,
    serve,
    sync,
)

app = typer.Typer(
    name="git-xet",
    help="Versioned datasets in git: content-defined chunks, dedup, lazy mounts.",
    no_args_is_help=True,
    add_completion=False,  # typer's --install-completion misses `git xet`: see `completion`
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_text() -> str:
    from gitxet import chunking

    return f"git-xet {gitxet.__version__} (chunker: {chunking.IMPLEMENTATION})"


def _version(value: bool) -> None:
    if value:
        typer.echo(_version_text())
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show version and chunker."
        ),
    ] = False,
) -> None:
    """Versioned datasets in git: content-defined chunks, dedup, lazy mounts."""


plumbing.register(app)
gitcmds.register(app)
sync.register(app)
prune.register(app)
inspection.register(app)
logs.register(app)
mountcmds.register(app)
serve.register(app)
migrate.register(app)
hooks.register(app)
csi.register(app)
plugins.register(app)
completion.register(app)


def _reflow(doc: str) -> str:
    """A docstring as help text: each prose paragraph on one line (the terminal wraps it);
    paragraphs with indented lines or list items keep their line breaks."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    out = []
    for para in paragraphs:
        lines = para.splitlines()
        keep = any(ln.startswith((" ", "-", "*", "\b")) for ln in lines[1:]) or para.startswith(
            "\b"
        )
        out.append(para if keep else " ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def _reflow_help(typer_app: typer.Typer) -> None:
    # typer keeps a docstring's hard line breaks, which wrap raggedly in narrow terminals
    for cmd in typer_app.registered_commands:
        if cmd.help is None and cmd.callback is not None and cmd.callback.__doc__:
            cmd.help = _reflow(cmd.callback.__doc__)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _reflow_help(group.typer_instance)


_reflow_help(app)


def main() -> None:
    """Entry point: run the app, turning every error into one line and an exit code."""
    if os.environ.get("GITXET_TRACEBACK") == "1":
        app()
        return
    _interrupt.handle_signals()
    try:
        _run()
    finally:
        signum = _interrupt.received()
        if signum is not None:  # however the exception was caught on the way
            _interrupt.exit_now(signum)


def _run() -> None:
    try:
        rc = app(standalone_mode=False, prog_name="git-xet")
        if isinstance(rc, int) and rc:
            raise SystemExit(rc)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except typer.Exit as e:
        raise SystemExit(e.exit_code) from None
    except typer.Abort:
        print("git-xet: aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except BrokenPipeError:
        raise SystemExit(141) from None
    except Exception as e:
        if isinstance(e, typer.TyperException):  # click's errors (usage): one line, a hint
            _usage_error(e)
        _errors.fail(e)


def _usage_error(e: typer.TyperException) -> NoReturn:
    """``git-xet: <what is wrong>`` and ``hint: <where the help is>``, exit 2 (usage)."""
    from gitxet.settings import redact
    from gitxet.util.shown import shortened

    ctx = getattr(e, "ctx", None)
    where = ctx.command_path.replace("git-xet", "git xet", 1) if ctx is not None else "git xet"
    format_message = getattr(e, "format_message", None)
    text = format_message() if callable(format_message) else str(e)
    code = getattr(e, "exit_code", None)
    if not text.strip():  # no arguments: the help was shown instead (no_args_is_help)
        raise SystemExit(code if isinstance(code, int) and code else _errors.EXIT_USAGE)
    print(f"git-xet: {shortened(redact(' '.join(text.split())))}", file=sys.stderr)
    if ctx is not None:  # a usage error: where the help is
        print(f"hint: see '{where} --help'", file=sys.stderr)
    raise SystemExit(code if isinstance(code, int) and code else _errors.EXIT_ERROR)
