"""The Docker volume plugin against a real Docker engine started by the test.

dockerd runs with private data/exec roots and no networking (no iptables, no bridge); the
image is Debian's static busybox imported from a tarball (no pulls). The plugin is the real
``git-xet docker-plugin`` process, discovered by Docker through its socket in
``/run/docker/plugins``. Skips (with the reason) when not root, or when Docker, busybox or
FUSE is missing or dockerd cannot start; under ``CI=true`` each of those is a failure (the
test is marked ``docker``, see tests/helpers/ci.py), and .ci/deps.sh installs docker.io.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.fuse_env import fuse_unavailable_reason
from tests.helpers.server_env import stop_process

pytestmark = [pytest.mark.docker, pytest.mark.fuse, pytest.mark.slow, pytest.mark.timeout(240)]

DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"
# The client shipped with the engine first (same API version), else any docker CLI.
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")
BUSYBOX = "/bin/busybox"
PLUGIN_DIR = "/run/docker/plugins"
STEP = 30.0  # bound of any single wait


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run dockerd"
    if not os.path.exists(DOCKERD) or DOCKER is None:
        return "dockerd/docker not installed (Debian package docker.io)"
    if not os.path.exists(BUSYBOX):
        return "no static busybox for the test image (Debian package busybox-static)"
    return fuse_unavailable_reason()


def wait_for(what: str, check: object, timeout: float = STEP) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, IndexError):
        return False


def stop_pid(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; for processes this test started."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def mounts_at(path: str) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4] == path)


@dataclass
class Engine:
    sock: str
    root: Path
    log: Path

    def run(
        self, *args: str, check: bool = True, stdin: bytes | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[bytes]:
        assert DOCKER is not None
        r = subprocess.run(
            [DOCKER, "-H", f"unix://{self.sock}", *args],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            env={**os.environ, "DOCKER_CONFIG": str(self.root / "cli")},
        )
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {r.returncode}\n{r.stderr.decode()}")
        return r

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.decode().strip()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # Short paths: containerd's sockets live under the exec root (sun_path is 108 bytes).
    root = Path(tempfile.mkdtemp(prefix="gxdk-", dir="/tmp"))
    sock = str(root / "d.sock")
    log = root / "dockerd.log"
    argv = [
        DOCKERD,
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "-H",
        f"unix://{sock}",
        "--pidfile",
        str(root / "d.pid"),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    eng = Engine(sock, root, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                pytest.skip(f"dockerd did not start (status {proc.poll()}):\n{tail}")
            if os.path.exists(sock) and eng.run("version", check=False, timeout=10).returncode == 0:
                break
            time.sleep(0.1)
        yield eng
    finally:
        with contextlib.suppress(Exception):
            ids = eng.run("ps", "-aq", check=False, timeout=20).stdout.decode().split()
            if ids:
                eng.run("rm", "-f", *ids, check=False, timeout=60)
        stop_process(proc, 30)
        # dockerd stops the containerd it started; make sure, by its recorded pid
        for pidfile in (root / "exec").glob("containerd/containerd.pid"):
            with contextlib.suppress(ValueError, OSError):
                stop_pid(int(pidfile.read_text().strip()), 10)
        with open("/proc/self/mountinfo") as f:
            leftovers = [ln.split()[4] for ln in f if ln.split()[4].startswith(str(root))]
        for mnt in reversed(leftovers):
            subprocess.run(["umount", "-l", mnt], capture_output=True, check=False, timeout=10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def image(engine: Engine) -> str:
    """A busybox image with sh, sha256sum, cat, ls and sleep."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(BUSYBOX, arcname="bin/busybox")
        for tool in ("sh", "sha256sum", "cat", "ls", "sleep"):
            info = tarfile.TarInfo(f"bin/{tool}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            tar.addfile(info)
    name = "gitxet-test-busybox:1"
    engine.run("import", "-", name, stdin=buf.getvalue())
    return name


def sh(*args: str, cwd: Path) -> None:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"


@pytest.fixture
def dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, bytes]]:
    """A pushed gitxet repo (bare remote): a chunked big file and small plain files."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    sh("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    sh("git", "init", "-q", str(work), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(remote), cwd=work)
    sh("git-xet", "init", cwd=work)
    rnd = random.Random(6)
    files = {"big.bin": rnd.randbytes(3 << 20), "sub/a.txt": b"alpha\n"}
    for p, d in files.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        (work / p).write_bytes(d)
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v1", cwd=work)
    sh("git-xet", "push", "origin", "main", cwd=work)
    return remote, files


class PluginProc:
    """The ``git-xet docker-plugin`` process, (re)started and killed by the test."""

    def __init__(self, driver: str, state: Path) -> None:
        self.driver, self.state = driver, state
        self.sock = os.path.join(PLUGIN_DIR, f"{driver}.sock")
        self.log = state.parent / f"{driver}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gitxet",
                    "docker-plugin",
                    "--socket",
                    self.sock,
                    "--state-dir",
                    str(self.state),
                    "--log-level",
                    "debug",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = self.proc
        wait_for("the plugin socket", lambda: os.path.exists(self.sock) or proc.poll() is not None)
        assert proc.poll() is None, self.log.read_text()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(STEP)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STEP)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STEP)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock)

    def daemon_pids(self) -> list[int]:
        """Mount daemons the plugin started (from the mounter's records)."""
        pids = []
        for rec in (self.state / "mounter" / "mounts").glob("*.json"):
            with contextlib.suppress(ValueError, OSError):
                pids.append(int(json.loads(rec.read_text())["pid"]))
        return pids


def test_volume_lifecycle_with_a_real_engine(
    engine: Engine, image: str, dataset: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    remote, files = dataset
    driver = f"gitxet-test-{uuid.uuid4().hex[:8]}"
    vol = f"{driver}-vol"
    os.makedirs(PLUGIN_DIR, exist_ok=True)
    plugin = PluginProc(driver, tmp_path / "pstate")
    target = str(tmp_path / "pstate" / "volumes" / vol)
    daemons: set[int] = set()
    containers: list[str] = []
    want = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}

    def run_in(*cmd: str) -> str:
        return engine.out("run", "--rm", "--network", "none", "-v", f"{vol}:/data:ro", image, *cmd)

    def start_sleeper() -> str:
        cid = engine.out(
            "run", "-d", "--network", "none", "-v", f"{vol}:/data:ro", image, "sleep", "120"
        )
        containers.append(cid)
        return cid

    def inspect_mounts() -> int:
        status = json.loads(engine.out("volume", "inspect", vol))[0]["Status"]
        return int(status["mounts"])

    try:
        plugin.start()
        # bad input is refused with a clear message and leaves nothing behind
        for opts, message in (
            (["-o", f"repo={tmp_path}/nope.git", "-o", "commit=main"], "no such repository"),
            (["-o", f"repo={remote}", "-o", "commit=no-such-branch"], "no such revision"),
            (["-o", f"repo={remote}"], "'commit' is required"),
            (["-o", f"repo={remote}", "-o", "commit=main", "-o", "subdir=nope"], "subdir"),
        ):
            r = engine.run("volume", "create", "-d", driver, *opts, f"{vol}-bad", check=False)
            assert r.returncode != 0 and message in r.stderr.decode(), r.stderr.decode()
        assert vol not in engine.out("volume", "ls", "-q")

        engine.out(
            "volume", "create", "-d", driver, "-o", f"repo={remote}", "-o", "commit=main", vol
        )
        assert mounts_at(target) == 0  # nothing is mounted before a container needs it

        # a container reads the committed bytes
        out = run_in("sha256sum", "/data/big.bin", "/data/sub/a.txt")
        got = {line.split()[1].removeprefix("/data/"): line.split()[0] for line in out.splitlines()}
        assert got == want
        assert mounts_at(target) == 0  # the last container left: unmounted

        # two containers share one mount
        first = start_sleeper()
        assert mounts_at(target) == 1
        daemons.update(plugin.daemon_pids())
        (daemon,) = plugin.daemon_pids()
        start_sleeper()
        assert mounts_at(target) == 1 and plugin.daemon_pids() == [daemon]
        assert inspect_mounts() == 2
        assert run_in("cat", "/data/sub/a.txt") == "alpha"
        assert inspect_mounts() == 2

        # kill -9 the plugin: the mount keeps serving; a restarted plugin adopts it
        plugin.kill9()
        assert mounts_at(target) == 1 and pid_alive(daemon)
        plugin.start()
        assert vol in engine.out("volume", "ls", "-q")
        out = run_in("sha256sum", "/data/big.bin")
        assert out.split()[0] == want["big.bin"]
        assert plugin.daemon_pids() == [daemon] and inspect_mounts() == 2

        # containers leave one by one; the last one out unmounts
        engine.out("rm", "-f", first)
        wait_for("one user left", lambda: inspect_mounts() == 1)
        assert mounts_at(target) == 1
        engine.out("rm", "-f", containers[1])
        wait_for("the unmount", lambda: mounts_at(target) == 0)
        assert inspect_mounts() == 0
        wait_for("the mount daemon to exit", lambda: not pid_alive(daemon))

        # kill -9 the mount daemon under a running container: the next container that uses
        # the volume gets a working mount again (the plugin sees the dead one and remounts)
        holder = start_sleeper()
        (dead,) = plugin.daemon_pids()
        daemons.add(dead)
        os.kill(dead, signal.SIGKILL)
        wait_for("the killed daemon to exit", lambda: not pid_alive(dead))
        out = run_in("sha256sum", "/data/big.bin", "/data/sub/a.txt")
        got = {line.split()[1].removeprefix("/data/"): line.split()[0] for line in out.splitlines()}
        assert got == want
        assert plugin.daemon_pids() != [dead] and len(plugin.daemon_pids()) == 1
        daemons.update(plugin.daemon_pids())
        engine.out("rm", "-f", holder)
        wait_for("the unmount", lambda: mounts_at(target) == 0)

        # a container removed while the plugin is down: Docker ignores the failed Unmount
        # and never sends it again; the restarted plugin sees that no container holds the
        # mount and unmounts it (it served nobody until volume rm)
        gone = start_sleeper()
        (stale,) = plugin.daemon_pids()
        daemons.add(stale)
        plugin.kill9()
        engine.out("rm", "-f", gone)
        assert mounts_at(target) == 1
        plugin.start()
        wait_for("the unused mount to go", lambda: mounts_at(target) == 0)
        assert inspect_mounts() == 0
        wait_for("its daemon to exit", lambda: not pid_alive(stale))

        # docker volume rm: gone from the list, nothing mounted, no daemon left
        first = start_sleeper()
        daemons.update(plugin.daemon_pids())
        engine.out("rm", "-f", first)
        engine.out("volume", "rm", vol)
        assert vol not in engine.out("volume", "ls", "-q")
        assert mounts_at(target) == 0 and plugin.daemon_pids() == []
        assert not any(pid_alive(p) for p in daemons)
    except AssertionError:
        print(plugin.log.read_text(errors="replace")[-5000:] if plugin.log.exists() else "")
        raise
    finally:
        if containers:
            engine.run("rm", "-f", *containers, check=False)
        engine.run("volume", "rm", "-f", vol, check=False)
        daemons.update(plugin.daemon_pids())
        plugin.stop()
        if mounts_at(target):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False, timeout=10)
        for pid in daemons:
            if pid_alive(pid):
                stop_pid(pid, 5)
