"""``git xet logs``: read the error logs of the filter and hooks (see ``_errlog``)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from gitxet.cli._errlog import logs_dir
from gitxet.errors import NotFoundError

# ---- git xet logs ------------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    app.command("logs")(logs_cmd)


def _names(where: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(where) if n.endswith(".log"))
    except FileNotFoundError:
        return []


def logs_cmd(
    action: Annotated[
        str, typer.Argument(help="list (default), last, show NAME, or clear.")
    ] = "list",
    name: Annotated[str | None, typer.Argument(help="The log for 'show'.")] = None,
) -> None:
    """The error logs of the filter and hooks of this repository (newest last).

    'git xet logs' lists them, 'last' prints the newest, 'show NAME' one of them, 'clear'
    removes them all. Each holds the message git showed, the command and the traceback.
    """
    where = logs_dir()
    names = _names(where)
    if action == "list":
        for n in names:
            typer.echo(n)
        return
    if action == "clear":
        for n in names:
            os.unlink(os.path.join(where, n))
        typer.echo(f"git-xet: removed {len(names)} log(s) from {where}", err=True)
        return
    if action == "last":
        if not names:
            raise NotFoundError(f"no error logs in {where}")
        name = names[-1]
    elif action == "show":
        if name is None:
            raise typer.BadParameter("show needs the name of a log ('git xet logs' lists them)")
    else:
        raise typer.BadParameter(f"unknown action {action!r}: list, last, show NAME or clear")
    name = os.path.basename(name)
    if name not in names:
        raise NotFoundError(f"no error log {name!r} in {where}")
    with open(os.path.join(where, name), encoding="utf-8") as f:
        typer.echo(f.read(), nl=False)
