"""SQLite connections a fork can not break: :func:`connect` (every gitxet database opens here).

SQLite keeps process-wide state that a fork copies as it is: its mutexes (the allocator's
above all: memory statistics are on by default, so every allocation takes it) and, per
database file, which locks this process's connections hold. A fork while another thread is
inside SQLite, or has a statement or a transaction open, leaves the child a mutex locked for
good or a lock it believes it holds: its first SQLite call on that file waits forever (a
DataLoader worker forked while its parent read through ``xet://`` hung opening the store's
index) or reads without the lock it thinks it has. So every statement and transaction on a
connection opened here holds a process-wide gate while it is open, and ``os.fork`` (a
before-fork hook) closes the gate, waits until no other thread holds it, forks and opens it
again. Other threads' imports are waited for first (:mod:`gitxet.util.forks`), as a
thread importing a module may still need the gate.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from typing import Any, Self

from gitxet.util.forks import FORK_WAIT, wait_for_imports

_Token = tuple[int, list[int]]  # (the gate's generation, the holding thread's count)


class _ForkGate:
    """Held (shared, re-entrant per thread) by open statements and transactions; taken
    exclusively by ``os.fork``."""

    def __init__(self) -> None:
        self._generation = 0
        self._reset()

    def _reset(self) -> None:
        # an RLock: a cursor released by the garbage collector on the forking thread
        self._cond = threading.Condition(threading.RLock())
        self._held = 0
        self._forker: int | None = None
        self._threads = threading.local()
        self._generation += 1

    def _mine(self) -> list[int]:
        mine: list[int] | None = getattr(self._threads, "n", None)
        if mine is None:
            mine = self._threads.n = [0]
        return mine

    def enter(self) -> _Token:
        """Hold the gate (waiting while another thread forks); give the result to
        :meth:`leave`."""
        mine = self._mine()
        with self._cond:
            if not mine[0]:  # a thread already holding it goes on: the fork waits for it
                me = threading.get_ident()
                while self._forker is not None and self._forker != me:
                    self._cond.wait()
            self._held += 1
            mine[0] += 1
            return self._generation, mine

    def leave(self, token: _Token) -> None:
        generation, mine = token
        with self._cond:
            if generation != self._generation:
                return  # held before a fork, in the parent: not this child's
            self._held -= 1
            mine[0] -= 1
            if self._forker is not None:
                self._cond.notify_all()

    def before_fork(self) -> None:
        # imports first: this import registered the forks hook before the gate's, so it
        # runs after the gate is closed, and an importing thread may need the gate
        wait_for_imports()
        self._cond.acquire()  # held across the fork: no thread enters meanwhile
        self._forker = threading.get_ident()
        mine = self._mine()
        self._cond.wait_for(lambda: self._held <= mine[0], FORK_WAIT)

    def after_fork_in_parent(self) -> None:
        self._forker = None
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        self._reset()


_gate = _ForkGate()
os.register_at_fork(
    before=_gate.before_fork,
    after_in_parent=_gate.after_fork_in_parent,
    after_in_child=_gate.after_fork_in_child,
)


class Cursor(sqlite3.Cursor):
    """A cursor that holds the fork gate from its first statement until it is closed or
    collected (a statement not read to its end keeps a read transaction open)."""

    _token: _Token | None = None

    def _hold(self) -> None:
        if self._token is None:
            self._token = _gate.enter()

    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        self._hold()
        try:
            return super().execute(sql, parameters)
        finally:
            _sync_transaction(self.connection)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> Self:
        self._hold()
        try:
            return super().executemany(sql, seq_of_parameters)
        finally:
            _sync_transaction(self.connection)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        self._hold()
        try:
            return super().executescript(sql_script)
        finally:
            _sync_transaction(self.connection)

    def close(self) -> None:
        try:
            super().close()  # resets the statement while the gate is held
        finally:
            token, self._token = self._token, None
            if token is not None:
                _gate.leave(token)

    def __del__(self) -> None:
        if self._token is not None:
            with contextlib.suppress(Exception):  # a closed connection: nothing to reset
                self.close()


class Connection(sqlite3.Connection):
    """A connection whose cursors hold the fork gate, and which holds it itself while a
    transaction is open."""

    _token: _Token | None = None

    def cursor(self, factory: Any = Cursor) -> Any:
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        cursor: Cursor = self.cursor()
        return cursor.execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> Cursor:
        cursor: Cursor = self.cursor()
        return cursor.executemany(sql, seq_of_parameters)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        cursor: Cursor = self.cursor()
        return cursor.executescript(sql_script)

    def _ending(self, end: Callable[..., Any], *args: Any) -> Any:
        """``end(*args)``, which may end a transaction, with the gate held."""
        token = _gate.enter()
        try:
            return end(*args)
        finally:
            _sync_transaction(self)
            _gate.leave(token)

    def commit(self) -> None:
        self._ending(super().commit)

    def rollback(self) -> None:
        self._ending(super().rollback)

    def __exit__(self, *exc: Any) -> Any:  # commits or rolls back (in C: not by commit())
        return self._ending(super().__exit__, *exc)

    def close(self) -> None:
        token = _gate.enter()
        try:
            super().close()
        finally:
            held, self._token = self._token, None
            if held is not None:
                _gate.leave(held)
            _gate.leave(token)

    def __del__(self) -> None:
        # collected with a transaction open (its owner gone): SQLite rolls it back
        held, self._token = self._token, None
        if held is not None:
            _gate.leave(held)


def _sync_transaction(conn: Any) -> None:
    """Hold the gate while ``conn`` has a transaction open, and only then."""
    try:
        open_now = conn.in_transaction
    except sqlite3.ProgrammingError:  # closed
        open_now = False
    if open_now and conn._token is None:
        conn._token = _gate.enter()
    elif not open_now and conn._token is not None:
        token, conn._token = conn._token, None
        _gate.leave(token)


def connect(database: str, **kwargs: Any) -> Connection:
    """:func:`sqlite3.connect` (same arguments) of a connection whose statements and
    transactions hold the fork gate."""
    token = _gate.enter()
    try:
        conn: Connection = sqlite3.connect(database, factory=Connection, **kwargs)
    finally:
        _gate.leave(token)
    return conn
