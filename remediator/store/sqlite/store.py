"""The SQLite store: one state file (WAL; every write transaction BEGIN IMMEDIATE), pinned to the file it opened.

Shared by every gunicorn worker: metrics and the API read from here so all workers agree, and the
authority records intent here before it runs an action, so a crash of our own process loses nothing.

Once opened (init(), open(), or the first connection) the store remembers the file's device and inode.
It never creates a database after that: new connections open the existing file only (`mode=rw`), and
every connection and write transaction first checks that the path still names the same file. A state
file deleted or replaced behind our back raises StateError, so the authority stops acting at once
instead of going on with a second, empty store.

Writers take turns (`turn.py`: a lock per process, a `flock()` on `<state>-writer` across processes)
before `BEGIN IMMEDIATE`, so a storm's writers are served in about the order they came instead of by
SQLite's busy handler, whose growing sleeps let newcomers pass a writer that has waited long.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_health.remediator import state_traces
from llm_health.remediator.store.base import StateError
from llm_health.remediator.store.sqlite import schema
from llm_health.remediator.store.sqlite.turn import WriterTurn
from llm_health.remediator.store.tables import ReadVerbs, WriteVerbs


class HostClock(ReadVerbs):
    def lease_clock(self) -> None:
        """A file on one host has no clock of its own: the lease is timed by the holder's monotonic clock."""
        return None


class SqliteReads(HostClock):
    """The read verbs on one given connection (a short-lived reader)."""

    def __init__(self, c: sqlite3.Connection) -> None:
        self._c = c

    def _db(self) -> sqlite3.Connection:
        return self._c


class SqliteTx(SqliteReads, WriteVerbs):
    """Every verb (store/base.py Transaction) inside one BEGIN IMMEDIATE transaction."""


def file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class SqliteStore(HostClock):
    def __init__(self, path: str | Path, *, expect: tuple[int, int] | None = None) -> None:
        self.path = str(path)
        self._local = threading.local()
        self.identity: tuple[int, int] | None = expect
        self.broken = ""        # why the store stopped (deleted/replaced): sticky
        self._turn = WriterTurn(os.path.abspath(self.path))   # writers queue before SQLite's lock (turn.py)

    def _db(self) -> sqlite3.Connection:
        return self.conn()

    # -- connections and transactions ---------------------------------------------------------------
    def check_identity(self) -> str:
        if self.broken or self.identity is None:
            return self.broken
        now = file_identity(self.path)
        if now is None:
            self.broken = f"state file {self.path} was deleted while in use: stopped, restart the remediator"
        elif now != self.identity:
            self.broken = (f"state file {self.path} was replaced while in use (device/inode {self.identity} -> "
                           f"{now}): stopped, restart the remediator")
        return self.broken

    def _guard(self) -> None:
        why = self.check_identity()
        if why:
            raise StateError(why)

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        self._guard()
        if create:
            target, uri = self.path, False
        else:
            target, uri = f"file:{os.path.abspath(self.path)}?mode=rw", True
        try:
            c = sqlite3.connect(target, timeout=30.0, isolation_level=None, check_same_thread=False, uri=uri)
        except sqlite3.Error as exc:
            raise StateError(f"cannot open state {self.path}: {exc} (it is never created again while "
                             "running: restart the remediator)" if not create else
                             f"cannot open state {self.path}: {exc}") from exc
        seen = file_identity(self.path)
        if self.identity is None:
            self.identity = seen
        elif seen != self.identity:
            c.close()
            self._guard()
            raise StateError(f"state file {self.path} is not the file this remediator opened")
        return c

    def conn(self) -> sqlite3.Connection:
        """This thread's connection (autocommit reads). SQLite only: the store's own verbs and the tests."""
        self._guard()
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._connect(create=self.identity is None)
            try:
                c.row_factory = sqlite3.Row
                c.execute("PRAGMA busy_timeout = 30000")
                c.execute("PRAGMA journal_mode = WAL")
                c.execute("PRAGMA synchronous = FULL")
            except sqlite3.Error as exc:
                raise StateError(f"cannot open state {self.path}: {exc}") from exc
            self._local.conn = c
        return c

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with BEGIN IMMEDIATE so claims never race, in this writer's turn."""
        self._guard()
        c = self.conn()
        with self._turn.held():
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK")
                raise
            else:
                c.execute("COMMIT")

    @contextmanager
    def tx(self) -> Iterator[SqliteTx]:
        with self._transaction() as c:
            yield SqliteTx(c)

    @contextmanager
    def _short_connection(self) -> Iterator[sqlite3.Connection]:
        self._guard()
        try:
            c = sqlite3.connect(f"file:{os.path.abspath(self.path)}?mode=rw", timeout=30.0, isolation_level=None,
                                uri=True)
        except sqlite3.Error as exc:
            raise StateError(f"cannot open state {self.path}: {exc}") from exc
        try:
            c.row_factory = sqlite3.Row
            c.execute("PRAGMA busy_timeout = 30000")
            yield c
        finally:
            c.close()

    @contextmanager
    def reader(self) -> Iterator[SqliteReads]:
        """A short-lived read connection, closed afterwards (for threads that come and go, e.g. the
        agent-check handlers, which must not leave a connection behind per connection served)."""
        with self._short_connection() as c:
            yield SqliteReads(c)

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    # -- creating, migrating, opening ----------------------------------------------------------------
    def init(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        if self.identity is None and not os.path.lexists(self.path):
            found = state_traces.traces(Path(self.path))
            if found:     # it existed and is gone: never replaced by an empty one without a word
                raise StateError(state_traces.missing_state_message(Path(self.path), found))
        try:
            with self._transaction() as c:
                schema.migrate(c, self.path)
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state {self.path} is not usable: {exc}") from exc
        problem = self.integrity_problem()
        if problem:
            raise StateError(f"state {self.path} fails its integrity check: {problem} (restore a backup, or "
                             f"move the file away together with {state_traces.id_file(Path(self.path))} to start "
                             "over; the remediator does not start on a damaged state)")
        try:
            state_traces.write_id(Path(self.path))
        except OSError as exc:
            raise StateError(f"cannot write {state_traces.id_file(Path(self.path))}: {exc}") from exc

    def open(self) -> None:
        try:
            found = schema.version_of(self.conn())
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state {self.path} is not usable: {exc}") from exc
        schema.refuse_newer(found, self.path)

    # -- health -----------------------------------------------------------------------------------------
    def integrity_problem(self) -> str:
        """'' when `PRAGMA quick_check` passes on a fresh connection (no cached pages), else its report."""
        try:
            with self._short_connection() as c:
                rows = [str(r[0]) for r in c.execute("PRAGMA quick_check(5)").fetchall()]
        except (sqlite3.Error, StateError) as exc:
            return str(exc)
        return "" if rows == ["ok"] else "; ".join(rows)[:500]

    def write_problem(self, worker: str) -> str:
        """'' when a small committed write (a heartbeat row with a page of padding) succeeds: catches a
        full disk, a read-only file or file system, a locked or damaged database."""
        try:
            with self._transaction() as c:
                c.execute("INSERT INTO heartbeat (worker, at, pad) VALUES (?, ?, zeroblob(4096)) "
                          "ON CONFLICT(worker) DO UPDATE SET at = excluded.at, pad = excluded.pad",
                          (worker, time.time()))
                c.execute("DELETE FROM heartbeat WHERE at < ?", (time.time() - 3600,))
        except (sqlite3.Error, StateError, OSError) as exc:
            return f"state {self.path} is not writable: {exc}"
        return ""
