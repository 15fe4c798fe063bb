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


def test_checkout_and_its_old_name_materialize_have_distinct_help() -> None:
    """'materialize' is a hidden alias: the command list shows checkout only, and its help
    says what it is instead of repeating checkout's (issue 19)."""
    import typer.main

    group = typer.main.get_command(app)
    checkout = group.commands["checkout"]  # type: ignore[attr-defined]
    alias = group.commands["materialize"]  # type: ignore[attr-defined]
    assert not checkout.hidden and alias.hidden
    assert alias.help == "Same as 'git xet checkout'."
    assert checkout.help and checkout.help != alias.help
    assert "Materialize pointer files" in checkout.help


def test_every_visible_option_and_argument_says_what_it_is() -> None:
    """'--help' (and docs/cli.md, made from it) lists no option or argument with an empty
    description (nfs-serve --subdir, uninstall --local/--system, mounts --json and warmup's
    arguments had none)."""
    import typer.main

    def walk(cmd, path):  # type: ignore[no-untyped-def]
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])
        if not getattr(cmd, "hidden", False):
            for param in cmd.params:
                if not getattr(param, "hidden", False):
                    yield " ".join(path), param.name, (getattr(param, "help", None) or "").strip()

    found = list(walk(typer.main.get_command(app), ["git-xet"]))
    assert len(found) > 100
    assert [(cmd, name) for cmd, name, text in found if not text] == []
