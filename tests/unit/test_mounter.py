"""The Mounter boundary: spec checks, records, resolution, and SubprocessMounter on real FUSE."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gitxet.errors import FormatError, MountError, MountSpecError
from gitxet.mount.runner import is_mounted
from gitxet.plugins.docker_volume import VolumeDriver
from gitxet.plugins.mounter import (
    TOKEN_ENV,
    Mounter,
    MountInfo,
    MountSpec,
    SubprocessMounter,
    _Record,
    resolve_local,
    validate_spec,
)
from gitxet.settings import TOKEN_FILE_ENV
from tests.helpers.fake_mounter import FakeMounter
from tests.helpers.fuse_env import require_fuse

TOKEN = "tok-3f9a1c77e2-never-show-me"


def git(*args: str, cwd: Path) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[str, str]:
    """A bare repo with small plain files on main: (path, sha of main)."""
    work, bare = tmp_path / "work", tmp_path / "data.git"
    git("init", "-q", str(work), cwd=tmp_path)
    (work / "sub").mkdir()
    (work / "sub" / "a.txt").write_text("alpha\n")
    (work / "top.txt").write_text("top\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    return str(bare), git("rev-parse", "HEAD", cwd=work)


@dataclass
class FuseSite:
    """A repository to mount, a state dir and a target; the daemons a test started (``pids``)."""

    path: str
    sha: str
    state: str
    target: str
    pids: list[int] = dataclasses.field(default_factory=list)


@pytest.fixture
def site(tmp_path: Path, repo: tuple[str, str]) -> Iterator[FuseSite]:
    """For a real FUSE mount: killed daemons and a mount left behind are cleaned up after."""
    require_fuse()
    s = FuseSite(*repo, state=str(tmp_path / "state"), target=str(tmp_path / "mnt"))
    yield s
    for pid in s.pids:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    if is_mounted(s.target):
        subprocess.run(["fusermount3", "-u", "-z", s.target], check=False, timeout=10)


# ---- specs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (MountSpec("", "main"), "repo"),
        (MountSpec("  ", "main"), "repo"),
        (MountSpec("/r", ""), "commit"),
        (MountSpec("/r", "--upload-pack=x"), "commit"),
        (MountSpec("/r", "main", subdir="/abs"), "subdir"),
        (MountSpec("/r", "main", subdir="a/../b"), "subdir"),
        (MountSpec("/r", "main", subdir="a//b"), "subdir"),
        (MountSpec("/r", "main\n"), "commit"),
        (MountSpec("/r\0", "main"), "repo"),
        (MountSpec("/r", "main", cache_size="lots"), "cache_size"),
        (MountSpec("/r", "main", token=" "), "token"),
        (MountSpec("/r" * 3000, "main"), "repo"),
    ],
)
def test_validate_spec_names_the_bad_field(spec: MountSpec, field: str) -> None:
    with pytest.raises(MountSpecError) as exc:
        validate_spec(spec, "/mnt/x")
    assert exc.value.field == field
    assert exc.value.mountpoint == "/mnt/x"


def test_validate_spec_accepts_good_specs() -> None:
    for spec in (
        MountSpec("/srv/d.git", "main"),
        MountSpec("file:///srv/d.git", "a" * 40, subdir="train/images/", cache_size="10GiB"),
        MountSpec("https://hub/x", "v1.0", token="t", cache_size="512M", prefetch="16M"),
        MountSpec("https://hub/x", "v1.0", cas="http://tier.svc:8080/"),
    ):
        validate_spec(spec)


def test_token_is_not_in_repr_and_without_token_drops_it() -> None:
    spec = MountSpec("/r", "main", token=TOKEN)
    assert TOKEN not in repr(spec)
    assert spec.without_token().token is None
    assert spec.without_token() == MountSpec("/r", "main")


def test_fake_mounter_satisfies_the_protocol() -> None:
    fake: Mounter = FakeMounter({"/r": {"main": "b" * 40}})
    info = fake.mount(MountSpec("/r", "main", token=TOKEN), "/mnt/v")
    assert info == MountInfo("/mnt/v", MountSpec("/r", "main"), "b" * 40, info.pid)
    assert fake.is_mounted("/mnt/v") and fake.list() == [info]
    fake.unmount("/mnt/v")
    fake.unmount("/mnt/v")
    assert fake.list() == []


# ---- resolution --------------------------------------------------------------------------------


def test_resolve_local(repo: tuple[str, str], tmp_path: Path) -> None:
    path, sha = repo
    assert resolve_local(MountSpec(path, "main")) == sha
    assert resolve_local(MountSpec("file://" + path, sha[:10], subdir="sub")) == sha
    cases = [
        (MountSpec(str(tmp_path / "nope.git"), "main"), "repo"),
        (MountSpec(str(tmp_path), "main"), "repo"),
        (MountSpec(path, "no-such-branch"), "commit"),
        (MountSpec(path, "main", subdir="missing"), "subdir"),
        (MountSpec(path, "main", subdir="top.txt"), "subdir"),
        (MountSpec("https://example.invalid/x.git", "main"), "repo"),
    ]
    for spec, field in cases:
        with pytest.raises(MountSpecError) as exc:
            resolve_local(spec)
        assert exc.value.field == field, (spec, exc.value)


# ---- records -----------------------------------------------------------------------------------


def _record() -> _Record:
    return _Record(
        target="/mnt/v",
        spec=MountSpec("/r", "main", subdir="s", cache_size="1G", prefetch=None),
        commit_sha="c" * 40,
        pid=os.getpid(),
        start_time=1,
        log_path="/tmp/l",
        started_at=1.5,
    )


def test_record_round_trip_and_strict_parse() -> None:
    rec = _record()
    data = rec.to_json()
    assert _Record.from_json(data, "r") == rec
    body = json.loads(data)
    bad: list[bytes] = [
        data[: len(data) // 2],
        b"[]",
        b"\xff",
        json.dumps({**body, "version": 2}).encode(),
        json.dumps({**body, "token": "x"}).encode(),
        json.dumps({k: v for k, v in body.items() if k != "pid"}).encode(),
        json.dumps({**body, "pid": "12"}).encode(),
        json.dumps({**body, "pid": True}).encode(),
        json.dumps({**body, "pid": 0}).encode(),
        json.dumps({**body, "commit_sha": "main"}).encode(),
        json.dumps({**body, "target": "rel/path"}).encode(),
        b" " * (70 * 1024),
    ]
    for blob in bad:
        with pytest.raises(FormatError):
            _Record.from_json(blob, "r")


# ---- SubprocessMounter without FUSE: daemons that fail ---------------------------------------


def test_daemon_that_exits_is_a_mount_error_and_leaves_nothing(
    tmp_path: Path, repo: tuple[str, str]
) -> None:
    prog = (sys.executable, "-c", "import sys; print('boom: no fuse today'); sys.exit(3)")
    m = SubprocessMounter(str(tmp_path / "state"), program=prog, env=dict(os.environ))
    target = str(tmp_path / "mnt")
    with pytest.raises(MountError) as exc:
        m.mount(MountSpec(repo[0], "main"), target, timeout=20)
    assert exc.value.returncode == 3
    assert "boom: no fuse today" in exc.value.log_tail
    assert m.list() == [] and m.get(target) is None and not m.is_mounted(target)
    assert not is_mounted(target)


def test_daemon_that_never_mounts_times_out_and_is_killed(
    tmp_path: Path, repo: tuple[str, str]
) -> None:
    marker = tmp_path / "pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    m = SubprocessMounter(str(tmp_path / "state"), program=(sys.executable, "-c", code))
    t0 = time.monotonic()
    with pytest.raises(MountError, match="did not appear"):
        m.mount(MountSpec(repo[0], "main"), str(tmp_path / "mnt"), timeout=1.0)
    assert time.monotonic() - t0 < 15
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the stuck daemon was not killed"
    assert m.list() == []


def test_bad_input_starts_no_daemon(tmp_path: Path, repo: tuple[str, str]) -> None:
    ran = tmp_path / "ran"
    prog = (sys.executable, "-c", f"open({str(ran)!r}, 'w')")
    m = SubprocessMounter(str(tmp_path / "state"), program=prog)
    target = str(tmp_path / "mnt")
    for spec, field in (
        (MountSpec(str(tmp_path / "nope"), "main"), "repo"),
        (MountSpec(repo[0], "nope"), "commit"),
        (MountSpec(repo[0], "main", subdir="nope"), "subdir"),
        (MountSpec(repo[0], ""), "commit"),
    ):
        with pytest.raises(MountSpecError) as exc:
            m.mount(spec, target)
        assert exc.value.field == field
        assert exc.value.mountpoint == target
    assert not ran.exists()
    assert m.list() == []


# ---- SubprocessMounter on real FUSE ------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


@pytest.mark.fuse
def test_mount_share_restart_recover_unmount(site: FuseSite) -> None:
    path, sha, state, target, pids = site.path, site.sha, site.state, site.target, site.pids
    env = {**os.environ, TOKEN_ENV: "inherited-token-must-not-leak"}
    m = SubprocessMounter(state, env=env)
    spec = MountSpec(path, "main", token=TOKEN, cache_size="1GiB")
    info = m.mount(spec, target, timeout=30)
    pids.append(info.pid)
    assert info.commit_sha == sha and info.spec == spec.without_token()
    assert Path(target, "sub", "a.txt").read_text() == "alpha\n"
    # the same spec again is the same mount; another spec there is refused
    assert m.mount(MountSpec(path, sha, cache_size="1GiB"), target) == info
    with pytest.raises(MountError, match="another spec"):
        m.mount(MountSpec(path, "main", subdir="sub"), target)
    assert m.list() == [info] and m.is_mounted(target)

    # the token reaches the daemon through a file in memory only (neither argv, nor
    # its environment, nor the state dir on disk); a new token there rotates it
    environ = Path(f"/proc/{info.pid}/environ").read_bytes().split(b"\0")
    files = [e for e in environ if e.startswith(f"{TOKEN_FILE_ENV}=".encode())]
    (token_file,) = [Path(e.split(b"=", 1)[1].decode()) for e in files]
    assert str(token_file).startswith("/dev/shm/")
    assert token_file.read_text().strip() == TOKEN
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    assert not any(e.startswith(f"{TOKEN_ENV}=".encode()) for e in environ)
    assert not any(TOKEN.encode() in e for e in environ)
    assert b"GITXET_CACHE_SIZE=1GiB" in environ
    assert TOKEN.encode() not in Path(f"/proc/{info.pid}/cmdline").read_bytes()
    for f in Path(state).rglob("*"):
        if f.is_file():
            assert TOKEN.encode() not in f.read_bytes(), f
    assert m.mount(replace(spec, token=TOKEN + "2"), target) == info
    assert token_file.read_text().strip() == TOKEN + "2"
    assert m.mount(spec, target) == info

    # a new mounter on the same state (a restarted plugin) adopts the live mount
    m2 = SubprocessMounter(state, env=env)
    assert m2.list() == [info]
    report = m2.recover()
    assert report.adopted == [info] and not report.remounted and not report.failed

    # the daemon dies: the mount is no longer "mounted"; recover brings it back
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # list() does not probe the mount: it says "dead" once the killed daemon is gone
    # from the process table, which on a loaded machine comes after the probe does
    while (m2.is_mounted(target) or m2.list()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not m2.is_mounted(target) and m2.list() == []
    assert m2.get(target) == info  # the record stays for recovery
    report = m2.recover({target: TOKEN})
    assert not report.failed and len(report.remounted) == 1
    new = report.remounted[0]
    pids.append(new.pid)
    assert new.pid != info.pid and new.commit_sha == sha
    assert Path(target, "top.txt").read_text() == "top\n"
    assert token_file.read_text().strip() == TOKEN
    assert (
        f"{TOKEN_FILE_ENV}={token_file}".encode() in Path(f"/proc/{new.pid}/environ").read_bytes()
    )

    m2.unmount(target)
    m2.unmount(target)  # idempotent
    assert not is_mounted(target) and m2.list() == [] and m2.get(target) is None
    assert not token_file.exists()  # removed with the mount
    deadline = time.monotonic() + 10
    while _pid_alive(new.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(new.pid)


@pytest.mark.fuse
def test_remount_of_a_vanished_repo_fails_and_keeps_the_record(site: FuseSite) -> None:
    path, state, target = site.path, site.state, site.target
    m = SubprocessMounter(state, env={**os.environ, TOKEN_ENV: "plugin-own-token"})
    info = m.mount(MountSpec(path, "main", subdir="sub"), target, timeout=30)
    site.pids.append(info.pid)
    try:
        assert sorted(os.listdir(target)) == ["a.txt"]
        # a spec without a token gets none, not the one in the mounter's own environment
        assert b"GITXET_TOKEN" not in Path(f"/proc/{info.pid}/environ").read_bytes()
        os.kill(info.pid, signal.SIGKILL)
        os.rename(path, path + ".moved")
        deadline = time.monotonic() + 10
        while m.is_mounted(target) and time.monotonic() < deadline:
            time.sleep(0.05)
        report = SubprocessMounter(state, env=dict(os.environ)).recover()
        assert list(report.failed) == [target]
        assert "repo: " in report.failed[target] and "no such repository" in report.failed[target]
        assert not is_mounted(target), "a dead mount was left behind"
        assert m.get(target) is not None  # kept, so a later recover can retry
        os.rename(path + ".moved", path)
        report = m.recover()
        assert not report.failed and len(report.remounted) == 1
        assert sorted(os.listdir(target)) == ["a.txt"]
    finally:
        m.unmount(target)
    assert not is_mounted(target)


def test_a_cache_tier_reaches_the_daemon_and_the_record(tmp_path: Path) -> None:
    m = SubprocessMounter(str(tmp_path / "state"), env={"PATH": "/bin"})
    spec = MountSpec("https://hub/x", "main", cas="http://tier:8080")
    assert m._daemon_env(spec, "/mnt/v")["GITXET_CAS_URL"] == "http://tier:8080"
    assert "GITXET_CAS_URL" not in m._daemon_env(MountSpec("https://hub/x", "main"), "/mnt/v")
    rec = _record()
    rec = _Record(**{**rec.__dict__, "spec": spec})
    assert _Record.from_json(rec.to_json(), "r").spec.cas == "http://tier:8080"
    # a record written before cache tiers (no "cas" field) still reads
    old = json.loads(_record().to_json())
    del old["cas"]
    assert _Record.from_json(json.dumps(old).encode(), "r").spec.cas is None
    with pytest.raises(MountSpecError) as exc:
        validate_spec(MountSpec("https://hub/x", "main", cas="tier:8080"))
    assert exc.value.field == "cas"


@pytest.mark.fuse
def test_a_mount_started_by_a_killed_mounter_is_replaced_not_in_the_way(
    tmp_path: Path, site: FuseSite
) -> None:
    # The Docker plugin killed (kill -9) between starting a daemon and writing its record
    # left a live mount nobody had a record of: every later Mount of the volume failed with
    # "something else is already mounted there", and `volume rm` left it mounted.
    path, state, target, pids = site.path, site.state, site.target, site.pids
    spec = MountSpec(path, "main")
    m = SubprocessMounter(state)
    first = m.mount(spec, target, timeout=30)
    pids.append(first.pid)
    # what the killed plugin left: the mount and its start marker, no record
    m._records.remove(m._records.list()[0].target)
    os.makedirs(m._starting, exist_ok=True)
    Path(m._starting_marker(first.target)).write_text(first.target + "\n")
    m2 = SubprocessMounter(state)  # the restarted plugin
    second = m2.mount(spec, target, timeout=30)
    pids.append(second.pid)
    assert second.pid != first.pid
    assert Path(target, "sub", "a.txt").read_text() == "alpha\n"
    deadline = time.monotonic() + 10
    while _pid_alive(first.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(first.pid)  # the orphan's daemon exited once detached
    # a mount with no marker of ours is someone else's: still refused
    m2._records.remove(second.target)
    with pytest.raises(MountError, match="something else is already mounted there"):
        SubprocessMounter(state).mount(spec, target, timeout=30)
    # recovery detaches an orphan of ours too (a restarted plugin, no Mount call yet)
    Path(m2._starting_marker(second.target)).write_text(second.target + "\n")
    SubprocessMounter(state).recover()
    assert not is_mounted(target) and not os.listdir(m2._starting)
    # and the Docker plugin's start-up does the same
    third = SubprocessMounter(state).mount(spec, target, timeout=30)
    pids.append(third.pid)
    m2._records.remove(third.target)
    Path(m2._starting_marker(third.target)).write_text(third.target + "\n")
    VolumeDriver(SubprocessMounter(state), str(tmp_path / "dk"), str(tmp_path)).recover()
    assert not is_mounted(target)
