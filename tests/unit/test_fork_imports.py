"""A fork while another thread is importing a module leaves the child a working import of it
(gitxet.util.forks): the module's import lock, held by the importing thread at the fork, stayed
locked in the child for good. A DataLoader worker forked while a parent thread opened its
first ``xet://`` file over HTTP hung at ``import keyring`` (11 fresh runs in 11 here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

# Runs in a fresh interpreter: a thread imports ``slowmod``, whose body waits for a byte on a
# pipe; the main thread forks meanwhile (the byte is written once the fork has begun), and the
# child imports ``slowmod`` itself. SIGALRM (default action) ends a child stuck on the lock.
SCRIPT = r"""
import os, signal, sys, threading
import gitxet.dataset  # registers gitxet's before-fork hooks, as every xet:// reader does
started_r, started_w = os.pipe()
go_r, go_w = os.pipe()
os.environ["SLOWMOD_STARTED"], os.environ["SLOWMOD_GO"] = str(started_w), str(go_r)
sys.path.insert(0, sys.argv[1])
forking = threading.Event()
os.register_at_fork(before=forking.set)  # registered last: runs before gitxet's hooks

def release():
    forking.wait(60)
    os.write(go_w, b"g")

threading.Thread(target=release, daemon=True).start()
importer = threading.Thread(target=lambda: __import__("slowmod"), daemon=True)
importer.start()
os.read(started_r, 1)  # the importer is inside slowmod's body now
pid = os.fork()
if pid == 0:
    signal.alarm(10)
    import slowmod
    os._exit(0 if slowmod.VALUE == 1 else 3)
_, status = os.waitpid(pid, 0)
importer.join(30)
busy = gitxet.util.forks.imports_in_progress()
print("child", os.waitstatus_to_exitcode(status), "in progress after", busy)
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""

SLOWMOD = """import os
os.write(int(os.environ["SLOWMOD_STARTED"]), b"s")
os.read(int(os.environ["SLOWMOD_GO"]), 1)
VALUE = 1
"""


def test_a_fork_during_another_threads_import_leaves_the_child_able_to_import(
    tmp_path: Path,
) -> None:
    (tmp_path / "slowmod.py").write_text(SLOWMOD)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)  # 242 (-14 & 0xFF): the child hung
    assert "child 0 in progress after []" in r.stdout


# The same fork, with an importing thread whose module body runs an SQLite statement
# (gitxet.util.sqlite's gate): importing gitxet.util.sqlite alone registers both hooks, the
# imports' first, so it runs after the gate is closed; the gate's own hook waits for the
# imports before closing, or the importer waits on the closed gate, the fork on the import
# (FORK_WAIT), and the child is left the import lock.
SQLITE_SCRIPT = r"""
import os, signal, sys, threading, time
import gitxet.util.sqlite
from gitxet.util.forks import imports_in_progress
started_r, started_w = os.pipe()
go_r, go_w = os.pipe()
os.environ["SLOWMOD_STARTED"], os.environ["SLOWMOD_GO"] = str(started_w), str(go_r)
os.environ["SLOWMOD_DB"] = sys.argv[1] + "/db.sqlite"
sys.path.insert(0, sys.argv[1])
os.register_at_fork(before=lambda: os.write(go_w, b"g"))  # registered last: runs first
importer = threading.Thread(target=lambda: __import__("slowmod"), daemon=True)
importer.start()
os.read(started_r, 1)  # the importer is inside slowmod's body now
began = time.monotonic()
pid = os.fork()
if pid == 0:
    signal.alarm(10)
    import slowmod
    os._exit(0 if slowmod.VALUE == 1 else 3)
waited = time.monotonic() - began
_, status = os.waitpid(pid, 0)
importer.join(30)
print("child", os.waitstatus_to_exitcode(status), "fork waited", round(waited))
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""

SLOWMOD_SQLITE = """import os
from gitxet.util import sqlite
os.write(int(os.environ["SLOWMOD_STARTED"]), b"s")
os.read(int(os.environ["SLOWMOD_GO"]), 1)  # the fork has begun
with sqlite.connect(os.environ["SLOWMOD_DB"]) as db:
    db.execute("select 1").fetchall()
VALUE = 1
"""


def test_a_fork_waits_for_an_import_that_uses_sqlite_before_closing_the_gate(
    tmp_path: Path,
) -> None:
    (tmp_path / "slowmod.py").write_text(SLOWMOD_SQLITE)
    r = subprocess.run(
        [sys.executable, "-c", SQLITE_SCRIPT, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)  # 242 (-14 & 0xFF): the child hung
    assert "child 0 fork waited 0" in r.stdout, r.stdout
