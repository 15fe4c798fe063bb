"""Mount lifecycle pieces that need no mount: mount table, process identity, registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitxet.errors import FormatError, MountError
from gitxet.mount.runner import (
    MountProcess,
    MountRecord,
    MountRegistry,
    find_mount,
    is_mounted,
    mount_table,
    normalize_mountpoint,
    process_alive,
    process_start_time,
    read_log_tail,
    start_background,
    unmount,
)

MY_START = process_start_time(os.getpid())


def rec(mountpoint: str, pid: int = os.getpid(), start: int | None = MY_START) -> MountRecord:
    return MountRecord(
        mountpoint=mountpoint,
        pid=pid,
        start_time=start if start is not None else 0,
        kind="fuse",
        repo="/srv/repo",
        commit="0" * 40,
        cache_dir="/var/cache/gitxet",
        started_at=1_700_000_000.5,
        log_path="/tmp/x.log",
    )


# ---- mount table -------------------------------------------------------------------------------


def test_mount_table_parses_escapes_and_optional_fields(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_bytes(
        b"22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        b"42 22 0:39 / /mnt/with\\040space ro,nosuid shared:5 master:2 - fuse.gitxet "
        b"gitxet:repo ro,user_id=0\n"
        b"43 22 0:40 / /mnt/back\\134slash rw - nfs 127.0.0.1:/x rw\n"
    )
    rows = mount_table(str(info))
    assert [r.mountpoint for r in rows] == ["/", "/mnt/with space", "/mnt/back\\slash"]
    assert rows[1].device == "0:39"
    assert rows[1].fstype == "fuse.gitxet"
    assert rows[1].source == "gitxet:repo"
    assert rows[2].fstype == "nfs"
    assert find_mount("/mnt/with space", rows) == rows[1]
    assert find_mount("/mnt/other", rows) is None


def test_mount_table_rejects_malformed_lines(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_bytes(b"22 1 0:21 / / rw,relatime ext4 /dev/sda1 rw\n")  # no "-" separator
    with pytest.raises(FormatError, match="malformed mountinfo"):
        mount_table(str(info))
    with pytest.raises(MountError):
        mount_table(str(tmp_path / "missing"))


def test_real_mount_table() -> None:
    assert is_mounted("/")
    assert is_mounted("/proc")
    assert not is_mounted("/proc/self")


def test_normalize_mountpoint_resolves_only_the_parent(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    got = normalize_mountpoint(str(tmp_path / "alias" / "mnt"))
    assert got == os.path.join(os.path.realpath(tmp_path / "real"), "mnt")
    (tmp_path / "real" / "lnk").symlink_to("/elsewhere")
    # The last component is not followed (doing so would stat a possibly hung mount).
    assert normalize_mountpoint(str(tmp_path / "alias" / "lnk")).endswith("/real/lnk")
    assert normalize_mountpoint("/") == "/"


# ---- process identity --------------------------------------------------------------------------


def test_process_identity_uses_start_time() -> None:
    assert MY_START is not None
    assert process_alive(os.getpid(), MY_START)
    assert not process_alive(os.getpid(), MY_START + 1)  # a recycled pid is not ours
    assert process_start_time(2**22 + 12345) is None
    assert not process_alive(2**22 + 12345, 0)


def test_zombie_counts_as_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        start = process_start_time(proc.pid)
        assert start is not None
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not process_alive(proc.pid, start)  # exited, not yet reaped
    finally:
        proc.wait(10)


def test_read_log_tail_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    tail = read_log_tail(str(log), 3)
    assert tail == "line 99997\nline 99998\nline 99999"
    assert read_log_tail(str(tmp_path / "missing")) == ""
    size = log.stat().st_size
    with open(log, "a") as f:
        f.write("new run\n")
    assert read_log_tail(str(log), 20, start=size) == "new run"
    proc = MountProcess(1, 1, "/x", str(log), 0.0, log_offset=size)
    assert proc.log_tail() == "new run"


# ---- background start: failures that need no FUSE ----------------------------------------------


def test_daemon_that_exits_gives_mount_error_with_log_tail(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = "import sys; print('fatal: repository /nope not found'); sys.exit(3)"
    with pytest.raises(MountError) as info:
        start_background([sys.executable, "-c", script], str(mnt), timeout=20)
    err = info.value
    assert err.returncode == 3
    assert "repository /nope not found" in err.log_tail
    assert err.mountpoint == normalize_mountpoint(str(mnt))


def test_daemon_that_never_mounts_is_killed_at_timeout(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    # Ignores SIGTERM, so the runner has to escalate to SIGKILL.
    script = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('pid', os.getpid(), flush=True); time.sleep(60)"
    )
    start = time.monotonic()
    with pytest.raises(MountError) as info:
        start_background([sys.executable, "-c", script], str(mnt), timeout=1.0, log_path=str(log))
    assert time.monotonic() - start < 10
    assert "did not appear" in info.value.reason
    pid = int(info.value.log_tail.split()[-1])
    assert process_start_time(pid) is None  # killed and reaped
    assert log.read_text().startswith("pid ")


def test_start_background_refusals(tmp_path: Path) -> None:
    with pytest.raises(MountError, match="already mounted"):
        start_background([sys.executable, "-c", "pass"], "/proc")
    with pytest.raises(MountError, match="not a directory"):
        start_background([sys.executable, "-c", "pass"], str(tmp_path / "nope"))
    (tmp_path / "mnt").mkdir()
    with pytest.raises(MountError, match="cannot start"):
        start_background([str(tmp_path / "no-such-binary")], str(tmp_path / "mnt"))


def test_log_is_appended_and_tail_covers_this_run_only(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    log.write_text("old run output\n")
    with pytest.raises(MountError) as info:
        start_background(
            [sys.executable, "-c", "print('second run'); raise SystemExit(1)"],
            str(mnt),
            log_path=str(log),
        )
    assert info.value.log_tail == "second run"
    assert log.read_text() == "old run output\nsecond run\n"


# ---- registry ----------------------------------------------------------------------------------


def test_registry_roundtrip_and_atomic_files(tmp_path: Path) -> None:
    reg = MountRegistry(tmp_path / "state")
    r = rec("/proc")
    reg.record(r)
    assert reg.get("/proc") == r
    assert reg.get("/proc/") == r  # same mountpoint, spelled differently
    files = os.listdir(tmp_path / "state")
    assert len(files) == 1 and files[0].endswith(".json")  # no temp files left behind
    body = json.loads((tmp_path / "state" / files[0]).read_text())
    assert body["version"] == 3 and body["kind"] == "fuse" and body["watch"] == ""
    # a version 2 record (before watch) and a version 1 record (before subdir and metrics
    # were recorded) are still read
    del body["watch"]
    (tmp_path / "state" / files[0]).write_text(json.dumps({**body, "version": 2}))
    assert reg.get("/proc") == r
    del body["subdir"], body["metrics"]
    (tmp_path / "state" / files[0]).write_text(json.dumps({**body, "version": 1}))
    assert reg.get("/proc") == r
    assert reg.remove("/proc") is True
    assert reg.remove("/proc") is False
    assert reg.get("/proc") is None
    assert MountRegistry(tmp_path / "never-created").list() == []


def test_registry_prunes_unmounted_and_keeps_dead_mounts(tmp_path: Path) -> None:
    reg = MountRegistry(tmp_path)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = process_start_time(done.pid)
    done.wait(10)
    live = rec("/proc")  # mounted, and our own (live) process
    reg.record(live)
    reg.record(rec("/", pid=done.pid, start=dead_start))  # mounted, but the daemon died
    other = next(r.mountpoint for r in mount_table() if r.mountpoint not in ("/", "/proc"))
    reg.record(rec(other, start=(MY_START or 0) + 7))  # mounted, but the pid was recycled
    reg.record(rec(str(tmp_path / "not-mounted")))  # mountpoint unmounted
    assert reg.list() == [live]
    # the unmounted one is pruned; mounted ones whose daemon died stay, shown dead
    assert len(os.listdir(tmp_path)) == 3
    states = {st.record.mountpoint: st.state for st in reg.statuses(probe=False)}
    assert states == {"/proc": "ok", "/": "dead", other: "dead"}
    assert reg.get(str(tmp_path / "not-mounted")) is None


def _bad_record(tmp_path: Path, reg: MountRegistry, body: object) -> None:
    reg.record(rec("/proc"))
    path = tmp_path / os.listdir(tmp_path)[0]
    path.write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 4}, "unsupported version"),
        ({"pid": "12"}, "wrong type"),
        ({"pid": True}, "wrong type"),
        ({"kind": "smb"}, "unknown mount kind"),
        ({"surprise": 1}, "unknown fields"),
        ({"mountpoint": "relative/path"}, "not an absolute path"),
        ({"pid": -4}, "bad pid"),
    ],
)
def test_registry_parse_is_strict(tmp_path: Path, change: dict[str, object], message: str) -> None:
    reg = MountRegistry(tmp_path)
    body = json.loads(rec("/proc").to_json())
    body.update(change)
    _bad_record(tmp_path, reg, body)
    with pytest.raises(FormatError, match=message):
        reg.get("/proc")


def test_registry_rejects_garbage_and_huge_files(tmp_path: Path) -> None:
    reg = MountRegistry(tmp_path)
    _bad_record(tmp_path, reg, b"{not json")
    with pytest.raises(FormatError, match="not JSON"):
        reg.list()
    _bad_record(tmp_path, reg, b"[]")
    with pytest.raises(FormatError, match="not a JSON object"):
        reg.get("/proc")
    _bad_record(tmp_path, reg, b" " * 100_000)
    with pytest.raises(FormatError, match="larger than"):
        reg.get("/proc")
    body = json.loads(rec("/proc").to_json())
    del body["commit"]
    _bad_record(tmp_path, reg, body)
    with pytest.raises(FormatError, match="missing field 'commit'"):
        reg.get("/proc")


def test_record_kind_is_checked_on_write(tmp_path: Path) -> None:
    bad = MountRecord("/x", 1, 1, "smb", "", "", "", 0.0)
    with pytest.raises(ValueError):
        MountRegistry(tmp_path).record(bad)


def test_unmount_of_something_not_mounted_only_cleans_records(tmp_path: Path) -> None:
    reg = MountRegistry(tmp_path / "state")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(done.pid)
    done.wait(10)
    reg.record(rec(str(mnt), pid=done.pid, start=start))
    unmount(str(mnt), registry=reg, timeout=1)
    assert reg.get(str(mnt)) is None


def test_unmount_helpers_per_kind() -> None:
    from gitxet.mount.runner import _unmount_commands

    assert _unmount_commands("/m", "fuse.gitxet", lazy=False) == [
        ["fusermount3", "-u", "-q", "/m"],
        ["umount", "/m"],
    ]
    assert _unmount_commands("/m", "fuse", lazy=True) == [
        ["fusermount3", "-u", "-q", "-z", "/m"],
        ["umount", "-l", "/m"],
    ]
    assert _unmount_commands("/m", "nfs", lazy=False) == [["umount", "/m"]]


def test_log_names_never_collide(tmp_path: Path) -> None:
    from gitxet.mount.runner import log_path_for

    logs = str(tmp_path / "logs")
    spellings = ["/data/a_b", "/data/a/b", "/data_a/b", "/data/a b", "/data/a\nb", "/"]
    paths = [log_path_for(logs, m) for m in spellings]
    assert len(set(paths)) == len(spellings)  # "/a_b" and "/a/b" used to share one log
    assert all(os.path.dirname(p) == logs and p.endswith(".log") for p in paths)
    assert os.path.basename(paths[0]).startswith("a_b-")  # still readable
    assert "\n" not in paths[4] and " " not in paths[3]
    assert log_path_for(logs, "/data/a/b/") == paths[1]  # one mountpoint, one log
