"""``git xet token|repo|login`` through typer's CliRunner (server commands need no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gitxet.cli import serve
from gitxet.server.auth import TokenStore
from tests.helpers.keyring_backends import MemoryKeyring


@pytest.fixture
def app() -> typer.Typer:
    a = typer.Typer()
    serve.register(a)
    return a


def test_token_create_prints_the_token_alone(app: typer.Typer, tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app, ["token", "create", "--root", str(tmp_path), "--scope", "write", "--repo", "data"]
    )
    assert r.exit_code == 0, r.output
    token = r.stdout.strip()
    assert "\n" not in token and token.startswith("gxt_")
    rec = TokenStore(str(tmp_path)).authenticate(token)
    assert rec is not None and rec.scope == "write" and rec.repo == "data"
    assert token not in (tmp_path / "tokens.json").read_text()

    listed = CliRunner().invoke(app, ["token", "list", "--root", str(tmp_path)])
    assert rec.id in listed.stdout and "write" in listed.stdout and token not in listed.stdout

    assert (
        CliRunner().invoke(app, ["token", "revoke", "--root", str(tmp_path), rec.id]).exit_code == 0
    )
    assert TokenStore(str(tmp_path)).authenticate(token) is None
    assert (
        CliRunner().invoke(app, ["token", "revoke", "--root", str(tmp_path), rec.id]).exit_code == 4
    )


def test_token_create_rejects_bad_scope(app: typer.Typer, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["token", "create", "--root", str(tmp_path), "--scope", "admin"])
    assert r.exit_code != 0 and r.stdout == ""


def test_repo_create(app: typer.Typer, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["repo", "create", "--root", str(tmp_path), "data"])
    assert r.exit_code == 0 and Path(r.stdout.strip(), "HEAD").is_file()
    assert (
        CliRunner().invoke(app, ["repo", "create", "--root", str(tmp_path), "data"]).exit_code != 0
    )
    r = CliRunner().invoke(app, ["repo", "create", "--root", str(tmp_path), "../evil"])
    assert r.exit_code != 0 and not (tmp_path / "evil.git").exists()


def test_size_parser() -> None:
    assert serve._size("96M") == 96 << 20
    assert serve._size("2G") == 2 << 30
    assert serve._size("1024") == 1024
    assert serve._size("10KiB") == 10 << 10
    with pytest.raises(typer.BadParameter):
        serve._size("lots")


def test_login_checks_and_stores_the_token(
    app: typer.Typer, memkeyring: MemoryKeyring, tmp_path: Path
) -> None:
    from gitxet.server.run import BackgroundServer, ServerConfig

    token, _ = TokenStore(str(tmp_path)).create("read")
    with BackgroundServer(ServerConfig(root=str(tmp_path), port=0)) as s:
        r = CliRunner().invoke(
            app, ["login", f"{s.url}/data.git", "--token-stdin"], input=token + "\n"
        )
        assert r.exit_code == 0, r.output
        assert memkeyring.items == {("gitxet", s.url): token}
        assert token not in r.output
        bad = CliRunner().invoke(
            app, ["login", f"{s.url}/data.git", "--token-stdin"], input="gxt_nope\n"
        )
        assert bad.exit_code != 0
    assert json.loads((tmp_path / "tokens.json").read_text())["version"] == 1
