"""Command help: prose paragraphs reflow to the terminal; lists and examples keep their lines."""

from __future__ import annotations

from gitxet.cli.app import _reflow, app


def test_reflow_joins_prose_and_keeps_structure() -> None:
    doc = """First line.

    A paragraph that was wrapped
    by hand in the source.

    Steps:
    - one
    - two

    Example:
        git xet mount repo main /mnt
    """
    assert _reflow(doc) == (
        "First line.\n\n"
        "A paragraph that was wrapped by hand in the source.\n\n"
        "Steps:\n- one\n- two\n\n"
        "Example:\n    git xet mount repo main /mnt"
    )


def test_every_command_help_is_reflowed() -> None:
    def commands(typer_app):  # type: ignore[no-untyped-def]
        yield from typer_app.registered_commands
        for group in typer_app.registered_groups:
            yield from commands(group.typer_instance)

    seen = 0
    for cmd in commands(app):
        if cmd.callback is None or not cmd.callback.__doc__ or cmd.hidden:
            continue
        seen += 1
        assert cmd.help == _reflow(cmd.callback.__doc__), cmd.name
    assert seen > 20
