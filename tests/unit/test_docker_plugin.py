"""Docker volume plugin endpoints over a real unix-socket HTTP server, with a FakeMounter."""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gitxet.errors import FormatError, MountError, StateBusyError
from gitxet.plugins.docker_volume import PluginServer, VolumeDriver
from gitxet.plugins.mounter import MountInfo, MountSpec
from gitxet.util.statelock import lock_state_dir
from tests.helpers.fake_mounter import FakeMounter
from tests.helpers.secrets import assert_token_nowhere

SHA1, SHA2 = "1" * 40, "2" * 40
TOKEN = "tok-77c1d0e5-do-not-log"
REPOS = {"/srv/data.git": {"main": SHA1, "v2": SHA2}, "http://hub:8080/d.git": {"main": SHA1}}


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


class Plugin:
    """A running plugin (server thread) plus a keep-alive client connection."""

    def __init__(
        self,
        state: Path,
        mounter: FakeMounter,
        in_use: Callable[[str], bool | None] = lambda target: None,
    ) -> None:
        self.state, self.mounter = state, mounter
        self.driver = VolumeDriver(
            mounter,
            str(state),
            str(state / "volumes"),
            resolve=mounter.resolve,
            token_dir=str(state.parent),  # the test's tmp_path: token files live there
            in_use=in_use,
        )
        self.sock = str(state.parent / f"{state.name}.sock")
        self.server = PluginServer(self.sock, self.driver)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()
        self.conn = UnixHTTPConnection(self.sock)

    def raw(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        self.conn.request("POST", path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        data = resp.read()
        assert resp.getheader("Content-Type") == "application/vnd.docker.plugins.v1.2+json"
        return resp.status, json.loads(data)

    def call(self, endpoint: str, **body: Any) -> dict[str, Any]:
        status, answer = self.raw(endpoint, json.dumps(body).encode())
        assert status == 200, answer
        assert isinstance(answer, dict)
        return answer

    def ok(self, endpoint: str, **body: Any) -> dict[str, Any]:
        answer = self.call(endpoint, **body)
        assert answer.get("Err", "") == "", answer
        return answer

    def err(self, endpoint: str, **body: Any) -> str:
        answer = self.call(endpoint, **body)
        assert answer.get("Err"), answer
        return str(answer["Err"])

    def create(self, name: str, **opts: str) -> dict[str, Any]:
        return self.call("/VolumeDriver.Create", Name=name, Opts=opts)

    def stop(self) -> None:
        self.conn.close()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Plugin]:
    p = Plugin(tmp_path / "state", FakeMounter(REPOS))
    try:
        yield p
    finally:
        p.stop()


def target(p: Plugin, name: str) -> str:
    return str(p.state / "volumes" / name)


# ---- handshake -------------------------------------------------------------------------------


def test_activate_and_capabilities(plugin: Plugin) -> None:
    # Docker posts Activate with an empty body
    assert plugin.raw("/Plugin.Activate", b"") == (200, {"Implements": ["VolumeDriver"]})
    assert plugin.call("/VolumeDriver.Capabilities") == {"Capabilities": {"Scope": "local"}}
    assert plugin.raw("/VolumeDriver.List", b"null")[1] == {"Volumes": [], "Err": ""}


def test_http_errors(plugin: Plugin) -> None:
    assert plugin.raw("/VolumeDriver.Nope", b"{}")[0] == 404
    status, body = plugin.raw("/VolumeDriver.Create", b"{not json")
    assert status == 400 and "not JSON" in body["Err"]
    # a body too big to read is refused from its header, without reading it
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(plugin.sock)
        s.sendall(b"POST /VolumeDriver.Create HTTP/1.1\r\nContent-Length: 2097152\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"request body must be" in reply
    # the server survives all of that
    fresh = UnixHTTPConnection(plugin.sock)
    fresh.request("POST", "/Plugin.Activate", body=b"")
    assert json.loads(fresh.getresponse().read()) == {"Implements": ["VolumeDriver"]}
    fresh.close()


# ---- create / get / list / path / remove ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "opts", "message"),
    [
        ("v", {"commit": "main"}, "'repo' is required"),
        ("v", {"repo": "/srv/data.git"}, "'commit' is required"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "colour": "red"}, "unknown option"),
        ("v", {"repo": "/srv/nope.git", "commit": "main"}, "option 'repo'"),
        ("v", {"repo": "/srv/data.git", "commit": "nope"}, "option 'commit'"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "subdir": "../x"}, "option 'subdir'"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "cache_size": "big"}, "cache_size"),
        # sizes the mount daemon cannot parse are refused at create time (one grammar)
        ("v", {"repo": "/srv/data.git", "commit": "main", "cache_size": "1.5G"}, "cache_size"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "cache_size": "5B"}, "cache_size"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "prefetch": "1.5M"}, "prefetch"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "cas": "ftp://tier"}, "option 'cas'"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "cas": "http://u:p@t"}, "option 'cas'"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "token_file": "rel"}, "absolute"),
        ("v", {"repo": "/srv/data.git", "commit": "main", "token_file": "/nope"}, "token_file"),
        (
            "v",
            {"repo": "/srv/data.git", "commit": "main", "token": "a", "token_file": "/t"},
            "not both",
        ),
        ("../evil", {"repo": "/srv/data.git", "commit": "main"}, "bad volume name"),
        ("", {"repo": "/srv/data.git", "commit": "main"}, "bad volume name"),
    ],
)
def test_create_rejects_bad_input(
    plugin: Plugin, name: str, opts: dict[str, str], message: str
) -> None:
    answer = plugin.create(name, **opts)
    assert message in answer["Err"]
    assert plugin.ok("/VolumeDriver.List")["Volumes"] == []
    assert not plugin.state.joinpath("records").exists()
    assert plugin.mounter.calls == []


def test_create_get_list_path_remove(plugin: Plugin) -> None:
    assert plugin.create("ds", repo="/srv/data.git", commit="main", subdir="train/")["Err"] == ""
    assert plugin.mounter.calls == []  # nothing is mounted before a container needs it
    vol = plugin.ok("/VolumeDriver.Get", Name="ds")["Volume"]
    assert vol["Name"] == "ds" and vol["Mountpoint"] == ""
    assert vol["CreatedAt"].endswith("Z")
    assert vol["Status"] == {
        "repo": "/srv/data.git",
        "commit": "main",
        "commit_sha": SHA1,
        "subdir": "train",
        "mounts": 0,
        "auth": "none",
    }
    assert plugin.ok("/VolumeDriver.List")["Volumes"] == [{"Name": "ds", "Mountpoint": ""}]
    assert plugin.ok("/VolumeDriver.Path", Name="ds")["Mountpoint"] == ""
    assert "no such volume" in plugin.err("/VolumeDriver.Get", Name="other")
    assert "no such volume" in plugin.err("/VolumeDriver.Path", Name="other")
    assert "no volume Name" in plugin.err("/VolumeDriver.Get")

    # the same Create again is a no-op, other options are refused
    assert plugin.create("ds", repo="/srv/data.git", commit="main", subdir="train")["Err"] == ""
    assert "other options" in plugin.create("ds", repo="/srv/data.git", commit="v2")["Err"]

    plugin.ok("/VolumeDriver.Remove", Name="ds")
    assert plugin.ok("/VolumeDriver.List")["Volumes"] == []
    assert "no such volume" in plugin.err("/VolumeDriver.Remove", Name="ds")


def test_commit_is_pinned_at_create(plugin: Plugin) -> None:
    plugin.create("ds", repo="/srv/data.git", commit="main")
    REPOS_MOVED = {"/srv/data.git": {"main": SHA2, "v2": SHA2, "old": SHA1}}
    plugin.mounter.repos = REPOS_MOVED  # the branch moves after Create
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c1")
    assert plugin.mounter.mounts[target(plugin, "ds")].commit_sha == SHA1
    # a repeated Create naming the moved branch is still the same volume
    assert plugin.create("ds", repo="/srv/data.git", commit="main")["Err"] == ""


# ---- mount reference counting --------------------------------------------------------------


def test_mounts_are_shared_and_counted(plugin: Plugin) -> None:
    plugin.create("ds", repo="/srv/data.git", commit="v2")
    t = target(plugin, "ds")
    assert plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c1")["Mountpoint"] == t
    assert plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c2")["Mountpoint"] == t
    assert plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c2")["Mountpoint"] == t  # repeat
    assert plugin.mounter.calls == [("mount", t)]  # one mount for every container
    info = plugin.mounter.mounts[t]
    assert info.commit_sha == SHA2 and info.spec.commit == SHA2
    assert plugin.ok("/VolumeDriver.Get", Name="ds")["Volume"]["Status"]["mounts"] == 2
    assert plugin.ok("/VolumeDriver.Path", Name="ds")["Mountpoint"] == t
    assert plugin.ok("/VolumeDriver.List")["Volumes"] == [{"Name": "ds", "Mountpoint": t}]

    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c1")
    assert plugin.mounter.is_mounted(t)
    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c1")  # unknown ID: no effect
    assert plugin.mounter.is_mounted(t)
    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c2")
    assert not plugin.mounter.is_mounted(t)
    assert plugin.ok("/VolumeDriver.Path", Name="ds")["Mountpoint"] == ""
    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c2")  # the last one again: idempotent

    # a later container mounts it again
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c3")
    assert plugin.mounter.calls.count(("mount", t)) == 2


class SlowMounter(FakeMounter):
    """Mounting takes a while, so concurrent requests overlap."""

    def mount(self, spec: MountSpec, target: str, *, timeout: float = 60) -> MountInfo:
        threading.Event().wait(0.2)
        return super().mount(spec, target, timeout=timeout)


def test_concurrent_mounts_share_one_mount(tmp_path: Path) -> None:
    p = Plugin(tmp_path / "state", SlowMounter(REPOS))
    try:
        p.create("ds", repo="/srv/data.git", commit="main")
        p.create("other", repo="/srv/data.git", commit="v2")
        answers: list[dict[str, Any]] = []

        def one(name: str, ident: str) -> None:
            conn = UnixHTTPConnection(p.sock)
            conn.request(
                "POST", "/VolumeDriver.Mount", body=json.dumps({"Name": name, "ID": ident})
            )
            answers.append(json.loads(conn.getresponse().read()))
            conn.close()

        threads = [threading.Thread(target=one, args=("ds", f"c{i}")) for i in range(6)]
        threads.append(threading.Thread(target=one, args=("other", "o1")))
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert len(answers) == 7 and all(a["Err"] == "" for a in answers)
        assert p.mounter.calls.count(("mount", target(p, "ds"))) == 1
        assert p.ok("/VolumeDriver.Get", Name="ds")["Volume"]["Status"]["mounts"] == 6
    finally:
        p.stop()


def test_mount_errors(plugin: Plugin) -> None:
    assert "no such volume" in plugin.err("/VolumeDriver.Mount", Name="nope", ID="c1")
    plugin.create("ds", repo="/srv/data.git", commit="main")
    assert "no mount ID" in plugin.err("/VolumeDriver.Mount", Name="ds")
    assert "no mount ID" in plugin.err("/VolumeDriver.Unmount", Name="ds")
    plugin.mounter.fail_next = MountError("/x", "daemon exited", log_tail="fuse: device busy")
    message = plugin.err("/VolumeDriver.Mount", Name="ds", ID="c1")
    assert "mount failed" in message and "fuse: device busy" in message
    # the failed mount is not counted: the volume can be removed and nothing is mounted
    assert plugin.ok("/VolumeDriver.Get", Name="ds")["Volume"]["Status"]["mounts"] == 0
    assert plugin.mounter.mounts == {}
    # the repo vanished after Create: a clear error, nothing counted
    plugin.mounter.repos = {}
    assert "repo" in plugin.err("/VolumeDriver.Mount", Name="ds", ID="c1")
    assert plugin.ok("/VolumeDriver.Get", Name="ds")["Volume"]["Status"]["mounts"] == 0
    plugin.ok("/VolumeDriver.Remove", Name="ds")


def test_remove_unmounts_and_drops_stale_ids(plugin: Plugin) -> None:
    plugin.create("ds", repo="/srv/data.git", commit="main")
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c1")
    # Docker only removes volumes no container references: leftover IDs are missed Unmounts
    plugin.ok("/VolumeDriver.Remove", Name="ds")
    assert plugin.mounter.mounts == {}
    assert plugin.ok("/VolumeDriver.List")["Volumes"] == []


# ---- tokens --------------------------------------------------------------------------------


def test_credentials_in_the_repo_url_become_the_token(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert (
        plugin.create("ds", repo=f"http://user:{TOKEN}@hub:8080/d.git", commit="main")["Err"] == ""
    )
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c1")
    t = target(plugin, "ds")
    assert plugin.mounter.tokens[t] == TOKEN
    assert plugin.mounter.mounts[t].spec.repo == "http://hub:8080/d.git"
    answers = json.dumps([plugin.ok("/VolumeDriver.Get", Name="ds")])
    assert '"auth": "token"' in answers
    assert_token_nowhere(
        TOKEN, paths=[plugin.state / "records"], texts=[answers, caplog.text], check_cli=False
    )
    # an explicit token wins over the URL's
    plugin.create("ds2", repo=f"http://u:{TOKEN}@hub:8080/d.git", commit="main", token="t2")
    plugin.ok("/VolumeDriver.Mount", Name="ds2", ID="c2")
    assert plugin.mounter.tokens[target(plugin, "ds2")] == "t2"


def test_mount_spec_secured_moves_url_credentials() -> None:
    spec = MountSpec(f"https://u:{TOKEN}@h/d.git", "main")
    assert spec.secured() == MountSpec("https://h/d.git", "main", token=TOKEN)
    assert MountSpec("https://u:x@h/d.git", "main", token="t").secured().token == "t"
    local = MountSpec("/srv/data.git", "main")
    assert local.secured() is local


def test_token_reaches_the_mount_but_no_response_table_or_log(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    plugin.create("ds", repo="/srv/data.git", commit="main", token=TOKEN)
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c1")
    t = target(plugin, "ds")
    assert plugin.mounter.tokens[t] == TOKEN
    answers = json.dumps(
        [plugin.ok("/VolumeDriver.Get", Name="ds"), plugin.ok("/VolumeDriver.List")]
    )
    assert TOKEN not in answers and '"auth": "token"' in answers
    (record,) = plugin.state.joinpath("records").iterdir()
    assert TOKEN not in record.read_text() and '"name": "ds"' in record.read_text()
    secret = plugin.state / "secrets" / "ds"
    assert secret.read_text() == TOKEN
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert plugin.create("ds", repo="/srv/data.git", commit="main", token="other")["Err"]
    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c1")
    plugin.ok("/VolumeDriver.Remove", Name="ds")
    assert not secret.exists()
    assert TOKEN not in caplog.text
    assert "created volume ds" in caplog.text


def test_token_file_is_read_at_each_mount(plugin: Plugin, tmp_path: Path) -> None:
    tf = tmp_path / "token"
    tf.write_text("first\n")
    plugin.create("ds", repo="/srv/data.git", commit="main", token_file=str(tf))
    assert plugin.ok("/VolumeDriver.Get", Name="ds")["Volume"]["Status"]["auth"] == "token_file"
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c1")
    assert plugin.mounter.tokens[target(plugin, "ds")] == "first"
    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c1")
    tf.write_text("rotated")
    plugin.ok("/VolumeDriver.Mount", Name="ds", ID="c2")
    assert plugin.mounter.tokens[target(plugin, "ds")] == "rotated"
    plugin.ok("/VolumeDriver.Unmount", Name="ds", ID="c2")
    tf.unlink()
    assert "token_file" in plugin.err("/VolumeDriver.Mount", Name="ds", ID="c3")
    tf.write_text("two\nlines\n")
    assert "one non-empty line" in plugin.err("/VolumeDriver.Mount", Name="ds", ID="c3")
    assert plugin.mounter.mounts == {}
    assert not (plugin.state / "secrets" / "ds").exists()


def test_token_files_only_from_the_operators_directory(tmp_path: Path) -> None:
    from gitxet.plugins.docker_volume import VolumeError, check_token_file

    tokens = tmp_path / "tokens"
    (tokens / "team").mkdir(parents=True)
    good = tokens / "team" / "t"
    good.write_text("tok\n")
    outside = tmp_path / "elsewhere"
    outside.write_text("host secret\n")
    (tokens / "link").symlink_to(outside)
    (tokens / "dirlink").symlink_to(tmp_path)
    assert check_token_file(str(good), str(tokens)) == str(good)
    cases = [
        (str(good), None, "--token-dir"),
        (str(outside), str(tokens), "outside"),
        (str(tokens / ".." / "elsewhere"), str(tokens), "outside"),
        (str(tokens), str(tokens), "outside"),
        (str(tokens / "link"), str(tokens), "symlink"),
        (str(tokens / "dirlink" / "elsewhere"), str(tokens), "symlink"),
        (str(tokens / "team"), str(tokens), "regular file"),
        (str(tokens / "missing"), str(tokens), "cannot read"),
        ("team/t", str(tokens), "absolute"),
    ]
    for path, base, needle in cases:
        with pytest.raises(VolumeError, match=needle):
            check_token_file(path, base)


# ---- restarts ------------------------------------------------------------------------------


def test_state_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    mounter = FakeMounter(REPOS)
    p = Plugin(state, mounter)
    try:
        p.create("a", repo="/srv/data.git", commit="main", token=TOKEN)
        p.create("b", repo="/srv/data.git", commit="v2")
        p.ok("/VolumeDriver.Mount", Name="a", ID="c1")
        p.ok("/VolumeDriver.Mount", Name="a", ID="c2")
        p.ok("/VolumeDriver.Mount", Name="b", ID="c3")
        p.ok("/VolumeDriver.Unmount", Name="b", ID="c3")
    finally:
        p.stop()

    # the mounts outlive the plugin (same mounter); a new plugin process reads the table
    p2 = Plugin(state, mounter)
    try:
        assert p2.driver.recover() == {}
        assert mounter.calls.count(("mount", target(p2, "a"))) == 1  # adopted, not remounted
        vols = {v["Name"]: v for v in p2.ok("/VolumeDriver.List")["Volumes"]}
        assert vols == {
            "a": {"Name": "a", "Mountpoint": target(p2, "a")},
            "b": {"Name": "b", "Mountpoint": ""},
        }
        assert p2.ok("/VolumeDriver.Get", Name="a")["Volume"]["Status"]["mounts"] == 2
        p2.ok("/VolumeDriver.Unmount", Name="a", ID="c1")
        assert mounter.is_mounted(target(p2, "a"))
        p2.ok("/VolumeDriver.Unmount", Name="a", ID="c2")
        assert not mounter.is_mounted(target(p2, "a"))
    finally:
        p2.stop()


def test_recover_remounts_volumes_in_use_and_drops_orphans(tmp_path: Path) -> None:
    state = tmp_path / "state"
    p = Plugin(state, FakeMounter(REPOS))
    try:
        p.create("a", repo="/srv/data.git", commit="main", token=TOKEN)
        p.create("gone", repo="/srv/data.git", commit="main")
        p.ok("/VolumeDriver.Mount", Name="a", ID="c1")
    finally:
        p.stop()
    # the node rebooted: no mounts survive; an orphan mount of ours lingers under the root
    mounter = FakeMounter(REPOS)
    orphan = str(state / "volumes" / "old")
    mounter.mount(MountSpec("/srv/data.git", "main"), orphan)
    p2 = Plugin(state, mounter)
    try:
        assert p2.driver.recover() == {}
        assert mounter.is_mounted(target(p2, "a")) and mounter.tokens[target(p2, "a")] == TOKEN
        assert not mounter.is_mounted(orphan) and not mounter.is_mounted(target(p2, "gone"))
        # a volume whose remount fails is reported, and a later Mount retries
        mounter.unmount(target(p2, "a"))
        mounter.fail_next = MountError(target(p2, "a"), "no fuse")
        assert "no fuse" in p2.driver.recover()["a"]
        assert p2.ok("/VolumeDriver.Mount", Name="a", ID="c2")["Mountpoint"] == target(p2, "a")
    finally:
        p2.stop()


def test_ids_of_containers_removed_while_the_plugin_was_down_are_dropped(tmp_path: Path) -> None:
    """Docker ignores a failed Unmount (``docker rm -f`` while the plugin is down) and never
    sends it again: the restarted plugin drops those IDs when no container holds the mount,
    instead of serving it to nobody until the volume is removed."""
    state = tmp_path / "state"
    mounter = FakeMounter(REPOS)
    p = Plugin(state, mounter)
    try:
        for name in ("gone", "used", "unknown", "again"):
            p.create(name, repo="/srv/data.git", commit="main")
            p.ok("/VolumeDriver.Mount", Name=name, ID=f"{name}-1")
        p.ok("/VolumeDriver.Mount", Name="gone", ID="gone-2")
    finally:
        p.stop()
    users = {"gone": False, "used": True, "unknown": None, "again": False}
    p2 = Plugin(state, mounter, in_use=lambda t: users[os.path.basename(t)])
    try:
        # a container started before the recovery ran: its ID is counted, the old one not
        p2.ok("/VolumeDriver.Mount", Name="again", ID="again-2")
        assert p2.driver.recover() == {}
        status = {
            n: p2.ok("/VolumeDriver.Get", Name=n)["Volume"]["Status"]["mounts"] for n in users
        }
        assert status == {"gone": 0, "used": 1, "unknown": 1, "again": 1}
        assert not mounter.is_mounted(target(p2, "gone"))
        assert p2.ok("/VolumeDriver.Path", Name="gone")["Mountpoint"] == ""
        assert all(mounter.is_mounted(target(p2, n)) for n in ("used", "unknown", "again"))
        p2.ok("/VolumeDriver.Unmount", Name="again", ID="again-2")  # the last one out
        assert not mounter.is_mounted(target(p2, "again"))
        # the IDs of before the restart are judged once: a later recovery keeps them
        users["used"] = False
        assert p2.driver.recover() == {}
        assert p2.ok("/VolumeDriver.Get", Name="used")["Volume"]["Status"]["mounts"] == 1
        mounts = {v["Name"]: v["Mountpoint"] for v in p2.ok("/VolumeDriver.List")["Volumes"]}
        assert mounts == {
            "again": "",
            "gone": "",
            "unknown": target(p2, "unknown"),
            "used": target(p2, "used"),
        }
    finally:
        p2.stop()


def test_a_table_of_an_earlier_version_is_imported_strictly(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    table = state / "volumes.json"
    good = {
        "version": 1,
        "volumes": [
            {
                "name": "a",
                "repo": "/r",
                "commit": "main",
                "commit_sha": SHA1,
                "subdir": "",
                "token_file": None,
                "has_token": False,
                "cache_size": None,
                "prefetch": None,
                "created_at": 1.0,
                "mount_ids": ["c1"],
            }
        ],
    }
    table.write_text(json.dumps(good))
    assert VolumeDriver(FakeMounter(), str(state), str(tmp_path / "v")).volumes["a"].mount_ids == [
        "c1"
    ]
    assert not table.exists() and len(list((state / "records").iterdir())) == 1
    again = VolumeDriver(FakeMounter(), str(state), str(tmp_path / "v")).volumes["a"]
    assert again.mount_ids == ["c1"] and again.commit_sha == SHA1  # now from the record
    vol = good["volumes"][0]  # type: ignore[index]
    bad = [
        "{",
        "[]",
        json.dumps({**good, "version": 9}),
        json.dumps({**good, "extra": 1}),
        json.dumps({**good, "volumes": [{**vol, "name": "../x"}]}),
        json.dumps({**good, "volumes": [{**vol, "mount_ids": [1]}]}),
        json.dumps({**good, "volumes": [{**vol, "has_token": "yes"}]}),
        json.dumps({**good, "volumes": [{**vol, "token": "x"}]}),
        json.dumps({**good, "volumes": [vol, vol]}),
        json.dumps({**good, "volumes": [{k: v for k, v in vol.items() if k != "repo"}]}),
    ]
    for text in bad:
        table.write_text(text)
        with pytest.raises(FormatError):
            VolumeDriver(FakeMounter(), str(state), str(tmp_path / "v"))
        assert table.exists()  # a table that does not parse is left for a human


def test_a_corrupt_volume_record_is_a_format_error(plugin: Plugin, tmp_path: Path) -> None:
    assert plugin.create("ds", repo="/srv/data.git", commit="main")["Err"] == ""
    (record,) = plugin.state.joinpath("records").iterdir()
    good = json.loads(record.read_text())
    assert good["version"] == 1 and good["commit_sha"] == SHA1

    def load() -> None:
        VolumeDriver(FakeMounter(), str(plugin.state), str(tmp_path / "v"))

    for body in (
        {**good, "version": 2},
        {**good, "mount_ids": [1]},
        {**good, "name": "other"},  # filed under another volume's name
        {**good, "has_token": "yes"},
        {k: v for k, v in good.items() if k != "repo"},
    ):
        record.write_text(json.dumps(body))
        with pytest.raises(FormatError):
            load()
    record.write_text("{")
    with pytest.raises(FormatError, match="not JSON"):
        load()


def test_one_plugin_per_state_dir_and_socket(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    fd = lock_state_dir(state, owner="plugin")
    try:
        with pytest.raises(StateBusyError, match="another plugin process"):
            lock_state_dir(state, owner="plugin")
    finally:
        os.close(fd)
    os.close(lock_state_dir(state))  # released with the process (here: the fd)

    p = Plugin(tmp_path / "state", FakeMounter(REPOS))
    try:
        with pytest.raises(StateBusyError, match="another process is serving"):
            PluginServer(p.sock, p.driver)
    finally:
        p.stop()
    assert not os.path.exists(p.sock)
    # a socket file left by a killed plugin is replaced
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(p.sock)
    left.close()
    server = PluginServer(p.sock, p.driver)
    server.server_close()


def test_a_busy_live_plugins_socket_is_never_taken_over(tmp_path: Path) -> None:
    """A listener whose accept backlog is full answers EAGAIN, not "refused": it is alive.

    (The plugin used to treat any connect error as "dead" and unlink the live socket.)
    """
    sock = str(tmp_path / "busy.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(sock)
    live.listen(0)
    waiting: list[socket.socket] = []
    try:
        while True:  # fill the backlog: the next connect cannot be queued
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            waiting.append(c)
            try:
                c.connect(sock)
            except BlockingIOError:
                break
        ino = os.stat(sock).st_ino
        driver = VolumeDriver(FakeMounter(REPOS), str(tmp_path / "state"), str(tmp_path / "v"))
        with pytest.raises(StateBusyError, match="still serves this socket"):
            PluginServer(sock, driver).server_close()
        assert os.stat(sock).st_ino == ino  # the live plugin's socket is still there
    finally:
        for c in waiting:
            c.close()
        live.close()


# ---- packaging -----------------------------------------------------------------------------

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "docker"


def _plugin_options() -> set[str]:
    import typer.main

    from gitxet.cli.app import app

    group = typer.main.get_command(app)
    cmd = group.commands["docker-plugin"]  # type: ignore[attr-defined]
    return {opt for p in cmd.params for opt in p.opts}


def _flags(argv: list[str]) -> dict[str, str]:
    assert all(a.startswith("--") for a in argv[::2]), argv
    return dict(zip(argv[::2], argv[1::2], strict=True))


def test_managed_plugin_config_matches_the_cli() -> None:
    config = json.loads((DEPLOY / "config.json").read_text())
    assert config["interface"]["types"] == ["docker.volumedriver/1.0"]
    entry = config["entrypoint"]
    flags = _flags(entry[1:])
    assert set(flags) <= _plugin_options()
    assert flags["--socket"] == "/run/docker/plugins/" + config["interface"]["socket"]
    assert flags["--mount-root"] == config["propagatedMount"]
    assert any(m["destination"] == flags["--state-dir"] for m in config["mounts"])
    assert config["linux"]["capabilities"] == ["CAP_SYS_ADMIN"]
    assert [d["path"] for d in config["linux"]["devices"]] == ["/dev/fuse"]
    assert config["linux"]["allowAllDevices"] is False
    # the entrypoint is the supervisor the Dockerfile installs, and it runs docker-plugin
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"COPY deploy/docker/supervise.sh {entry[0]}" in dockerfile
    assert "git-xet docker-plugin" in (DEPLOY / "supervise.sh").read_text()
    for path in (flags["--mount-root"], flags["--state-dir"], "/run/docker/plugins"):
        assert path in dockerfile


def test_systemd_unit_keeps_the_daemons_alive() -> None:
    unit = (DEPLOY / "gitxet-docker-plugin.service").read_text()
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = exec_start.removeprefix("ExecStart=").split()
    assert argv[1] == "docker-plugin"
    assert set(_flags(argv[2:])) <= _plugin_options()
    assert "KillMode=process" in unit.splitlines()
