"""Hidden commands git's post-checkout and post-merge hooks call.

gitxet needs no work after a checkout or merge: the filter already wrote every file (or
left a pointer, with ``xet.lazy``), so ``init``/``install``/``clone`` install only the
pre-push hook. These commands exist so that the shipped post-checkout and post-merge hook
templates, if installed, succeed at once instead of failing on an unknown command.
"""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("post-checkout", hidden=True)(post_checkout_cmd)
    app.command("post-merge", hidden=True)(post_merge_cmd)


def post_checkout_cmd(
    args: Annotated[list[str] | None, typer.Argument(help="What git passes.")] = None,
) -> None:
    """post-checkout hook: nothing to do (the filter materialized the files)."""


def post_merge_cmd(
    args: Annotated[list[str] | None, typer.Argument(help="What git passes.")] = None,
) -> None:
    """post-merge hook: nothing to do (the filter materialized the files)."""
