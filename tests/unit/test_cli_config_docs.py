"""docs/cli.md's "Configuration" section names every variable and git config key gitxet
reads (issue 19): a new ``GITXET_*`` name or ``xet.*`` key in the code fails this test
until it is documented there, with its default."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    return text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]


def _sources() -> list[Path]:
    files = [p for p in (ROOT / "gitxet").rglob("*") if p.is_file() and p.suffix != ".pyc"]
    return [*files, ROOT / "setup.py"]


def _names(pattern: str) -> dict[str, str]:
    """Each match of ``pattern`` (group 1) in gitxet's sources -> the first file naming it."""
    found: dict[str, str] = {}
    for path in _sources():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a compiled extension
            continue
        for m in re.finditer(pattern, text):
            found.setdefault(m.group(1), str(path.relative_to(ROOT)))
    return found


def test_every_variable_is_documented() -> None:
    # @GITXET_NAME@-style words are hook-template placeholders, not variables
    variables = _names(r"(?<![@\w])(GITXET_[A-Z0-9_]+)(?![@\w])")
    assert {"GITXET_TOKEN", "GITXET_LAZY", "GITXET_SKIP_PREPUSH"} <= set(variables)
    section = _section()
    missing = {n: f for n, f in variables.items() if f"`{n}" not in section}
    assert not missing, f"variables docs/cli.md's Configuration does not name: {missing}"


def test_every_config_key_is_documented_with_its_default() -> None:
    keys = _names(r"""["'](xet\.[A-Za-z]+)(?![\w.])""")
    assert {"xet.lazy", "xet.threshold", "xet.remote", "xet.recentRefsDays"} <= set(keys)
    rows = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([\w.*]+)` \|.*\| ([^|]+) \|$", _section(), re.M)
    }
    missing = {k: f for k, f in keys.items() if k not in rows}
    assert not missing, f"config keys docs/cli.md's Configuration does not list: {missing}"
    assert all(rows[k] for k in keys), "a key without its default"


def test_every_setting_variable_has_a_row_with_its_default() -> None:
    from gitxet.settings import VARIABLES

    section = _section()
    for name, _, default in VARIABLES:
        assert f"| `{name}` |" in section and default in section, name
