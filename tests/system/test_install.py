"""Install as a user would, in a fresh virtualenv: the package with no extras (issue 19).

The wheel is built from this checkout (the C chunker compiled) and installed with pip into a
new ``python -m venv``. Its dependencies are exactly the core ones: the closure of gitxet's
``Requires-Dist`` without extras, taken from this environment (no network) and linked into a
directory the new venv reads through a ``.pth`` file; so ``pyfuse3``, ``uvicorn`` and
``grpc`` are not importable there. Then, with only that venv's ``bin`` added to PATH:

- ``git xet mount``, ``serve`` and ``csi`` exit 1 with one line naming the extra to install;
- ``git xet repo create`` works (it needs no web server);
- ``git xet --help``, ``git help xet`` and ``man git-xet-mount`` show the manual pages the
  wheel installed into ``share/man/man1`` (man finds them from PATH's ``../share/man``);
- bash completes ``git xet mo<TAB>`` with git's completion script and the installed one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
GIT_BASH_COMPLETION = Path("/usr/share/bash-completion/completions/git")


def _core_distributions() -> list[metadata.Distribution]:
    """gitxet's dependencies without extras, and theirs, as installed here."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [(req, "") for req in metadata.requires("gitxet") or []]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen:
            continue
        dist = metadata.distribution(req.name)
        seen[key] = dist
        todo += [(r, e) for r in dist.requires or [] for e in ("", *req.extras)]
    return list(seen.values())


def _link_core_deps(target: Path) -> None:
    """Symlink the top-level entries (packages, modules, dist-info) of the core
    distributions into ``target``."""
    target.mkdir()
    for dist in _core_distributions():
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = base / top
            if src.exists() and not (target / top).exists() and top != "__pycache__":
                (target / top).symlink_to(src)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, listed):
        p = ROOT / os.fsdecode(rel)
        if p.is_file():
            (src / os.fsdecode(rel)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, src / os.fsdecode(rel))
    dist = tmp / "dist"
    env = dict(os.environ, GITXET_REQUIRE_NATIVE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        check=True,
        env=env,
        timeout=300,
    )
    (wheel,) = dist.glob("gitxet-*.whl")
    v = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True)
    py = v / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        env=env,
        timeout=300,
    )
    _link_core_deps(tmp / "core-deps")
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "core_deps.pth").write_text(str(tmp / "core-deps") + "\n")
    yield v


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MANPATH", "PYTHONPATH")}
    # the new venv's bin first; the rest of PATH for git, man and bash only
    rest = [p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "git-xet").exists()]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *rest])
    env.update(MANPAGER="cat", PAGER="cat", GIT_PAGER="cat", MANWIDTH="100", COLUMNS="100")
    return env


def run(venv: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), cwd=cwd, env=_env(venv), capture_output=True, text=True, timeout=120
    )


def test_only_core_dependencies_are_there(venv: Path) -> None:
    assert shutil.which("git-xet", path=_env(venv)["PATH"]) == str(venv / "bin" / "git-xet")
    for module in ("pyfuse3", "trio", "uvicorn", "starlette", "grpc"):
        r = run(venv, str(venv / "bin" / "python"), "-c", f"import {module}")
        assert r.returncode != 0, f"{module} is importable: the test venv is not bare"
    r = run(venv, "git", "xet", "--version")
    assert r.returncode == 0 and "native (C)" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["mount", "{repo}", "main", "{mnt}"], "mount"),
        (["serve", "--root", "{tmp}/srv", "--port", "0"], "server"),
        (["csi", "--node-id", "n1", "--state-dir", "{tmp}/csi"], "csi"),
    ],
)
def test_optional_commands_name_what_to_install(
    venv: Path, tmp_path: Path, args: list[str], extra: str
) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (tmp_path / "mnt").mkdir()
    filled = [a.format(repo=repo, mnt=tmp_path / "mnt", tmp=tmp_path) for a in args]
    r = run(venv, "git", "xet", *filled, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(lines) == 1 and f"pip install 'gitxet[{extra}]'" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_repo_create_needs_no_server(venv: Path, tmp_path: Path) -> None:
    r = run(venv, "git", "xet", "repo", "create", "--root", str(tmp_path / "srv"), "data")
    assert r.returncode == 0, r.stderr
    made = Path(r.stdout.strip())
    assert made.is_dir() and (made / "HEAD").is_file()
    bare = subprocess.run(
        ["git", "-C", str(made), "rev-parse", "--is-bare-repository"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert bare == "true"


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["git", "xet", "--help"], "git-xet-mount(1)"),
        (["git", "help", "xet"], "git-xet-mount(1)"),
        (["man", "git-xet-mount"], "--nonempty"),
        (["man", "git-xet-token"], "GIT XET TOKEN CREATE"),
    ],
)
def test_manual_pages_are_found(venv: Path, args: list[str], expect: str) -> None:
    assert (venv / "share" / "man" / "man1" / "git-xet.1").is_file()
    r = run(venv, *args)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout, r.stdout[:2000]


def test_bash_completes_git_xet(venv: Path, tmp_path: Path) -> None:
    script = venv / "share" / "bash-completion" / "completions" / "git-xet"
    assert script.is_file()
    if not GIT_BASH_COMPLETION.is_file():
        pytest.skip("git's bash completion script is not installed")
    probe = f"""
source {GIT_BASH_COMPLETION}
source {script}
complete_line() {{
    COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
    COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()
    __git_wrap__git_main
    echo "${{COMPREPLY[*]}}"
}}
complete_line git xet mo
complete_line git xet mount --non
"""
    r = run(venv, "bash", "--norc", "--noprofile", "-i", "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["mount mounts", "--nonempty"], r.stdout + r.stderr


def test_zsh_completes_git_xet(venv: Path, tmp_path: Path) -> None:
    script = venv / "share" / "zsh" / "site-functions" / "_git-xet"
    assert script.is_file() and script.read_text().startswith("#compdef git-xet")
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    # git's zsh completion calls _git-xet with the words from "xet" on; _arguments (which
    # needs a live completion widget) is replaced by a stub that prints what it gets
    probe = f"""
_arguments() {{ print -r -- "$*" }}
compdef() {{ : }}
source {script}
words=(xet mo); CURRENT=2; _git-xet
words=(git-xet mount --nonem); CURRENT=3; _git-xet
"""
    r = run(venv, "zsh", "-f", "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert '"mount":' in first and '"mounts":' in first, r.stdout
    assert '"--nonempty":' in second, r.stdout


def test_fish_completes_git_xet(venv: Path, tmp_path: Path) -> None:
    script = venv / "share" / "fish" / "vendor_conf.d" / "git-xet.fish"
    assert script.is_file()
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    probe = f"source {script}; complete -C'git xet mo'; complete -C'git-xet mount --nonem'"
    r = run(venv, "fish", "--no-config", "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = [ln.split("\t")[0] for ln in r.stdout.splitlines()]
    assert names == ["mount", "mounts", "--nonempty"], r.stdout
