"""The PostgreSQL store: the remediator's state in a database several remediators share (docs/ha.md).

Writers are serialised as on SQLite (BEGIN IMMEDIATE): every write transaction first takes ONE
transaction-level advisory lock (`pg_advisory_xact_lock(WRITE_LOCK)`), so a claim's reads and its intent
are decided under the same lock by every remediator of the cluster, and the lock is released by COMMIT,
ROLLBACK or the death of the session (never held by a dead client: no session locks). Reads run on their
own pooled connection in autocommit.

Every I/O has a deadline (`timeout`, remediator.state_timeout): connecting, waiting for a pooled connection,
any statement and any lock wait; TCP keepalives and tcp_user_timeout find a vanished server. A database that
cannot be reached raises StateError: the web side answers 503 (Alertmanager retries), the lease cannot be
renewed and lapses, and nothing half-done is recorded.

The state is pinned like the SQLite file: at creation the schema records a random state id, and every
write transaction checks it, so a database dropped and created again behind our back (an empty state)
stops the remediator instead of being used. The lease is timed by the database's clock (`lease_clock`),
the same for every remediator of the cluster.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from llm_health.remediator.store.base import StateError
from llm_health.remediator.store.postgresql import schema
from llm_health.remediator.store.postgresql.conn import (
    BatchedDb,
    PgDb,
    PooledReads,
    connection,
    pg_row,
)
from llm_health.remediator.store.tables import ReadVerbs, WriteVerbs
from llm_health.remediator.store.tables.connected import Db

#: the key of the advisory lock every write transaction takes (any constant; ours: "llmh" in ASCII)
WRITE_LOCK = 0x6C6C6D68
#: a transaction of ours waits on nothing but the database, so one idle this long has a frozen or vanished
#: client (SIGSTOP, a paused VM, a lost host): PostgreSQL ends it, and WRITE_LOCK with it, well inside the
#: shortest lease (5 s). At 60 s, a leader frozen inside a write transaction held every other remediator's
#: writes (the lease's takeover, every webhook) for a minute: the fault-injection benchmark found it.
IDLE_IN_TRANSACTION_MS = 2500
#: the random id the schema recorded at creation: every write transaction checks it (PostgresStore._pin)
STATE_ID = "SELECT state_id FROM schema_version WHERE one = 1"
POOL_SIZE = 8


class DatabaseClock(ReadVerbs):
    def lease_clock(self) -> tuple[float, str]:
        """The database's clock now (seconds) and its name: the lease's time base, shared by every holder."""
        r = self._db().execute("SELECT extract(epoch FROM clock_timestamp())::float8, current_database()").fetchone()
        return float(r[0]), f"postgresql:{r[1]}"


class PgReads(DatabaseClock):
    """The read verbs on one given connection (a short-lived reader, or a transaction)."""

    def __init__(self, db: Db) -> None:
        self._conn = db

    def _db(self) -> Db:
        return self._conn


class PgTx(PgReads, WriteVerbs):
    """Every verb (store/base.py Transaction) inside one write transaction under WRITE_LOCK."""


def redacted(url: str) -> str:
    """host:port/dbname of a postgresql:// URL, for messages (never its user info)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(unparsable URL)"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"postgresql://{host}:{port}/{info.get('dbname') or ''}"


class PostgresStore(DatabaseClock):
    def __init__(self, url: str, *, password: str | None = None, timeout: float = 10.0,
                 pool_size: int = POOL_SIZE) -> None:
        info = psycopg.conninfo.conninfo_to_dict(url)
        if info.get("password"):
            raise StateError("remediator.state: the PostgreSQL URL carries a password; put it in "
                             "remediator.state_password_file, PGPASSWORD or ~/.pgpass instead (a URL is logged and "
                             "shown, a password must never be)")
        self.url = url
        self.where = redacted(url)
        self.path = self.where            # what messages name (the SQLite store's file path)
        self.identity: tuple[int, int] | None = None   # a file's identity: none for a database
        self.timeout = timeout
        self.pool_size = pool_size
        self._password = password
        self._pool_lock = threading.Lock()
        self._pool_obj: psycopg_pool.ConnectionPool[Any] | None = None
        self._pool_pid = 0
        self.state_id = ""                # the random id the schema recorded at creation (pinned at init/open)
        self.broken = ""

    # -- connections ------------------------------------------------------------------------------------
    def _kwargs(self) -> dict[str, Any]:
        ms = int(self.timeout * 1000)
        # the URL's own options come first (e.g. `?options=-csearch_path%3Dllmh`, the state in a schema of its
        # own on a shared database): a keyword argument replaces the URL's value, it does not add to it
        own = psycopg.conninfo.conninfo_to_dict(self.url).get("options") or ""
        kw: dict[str, Any] = {
            "autocommit": True, "row_factory": pg_row, "connect_timeout": max(1, int(self.timeout)),
            "application_name": "llm-health-remediator",
            "options": f"{own} -c statement_timeout={ms} -c lock_timeout={ms} "
                       f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}".lstrip(),
            "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
            "tcp_user_timeout": ms,
        }
        if self._password is not None:
            kw["password"] = self._password
        return kw

    def _pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """This process' pool (a forked worker opens its own; the parent's connections are not shared)."""
        with self._pool_lock:
            if self._pool_obj is None or self._pool_pid != os.getpid():
                self._pool_obj = psycopg_pool.ConnectionPool(
                    self.url, kwargs=self._kwargs(), min_size=1, max_size=self.pool_size, timeout=self.timeout,
                    max_idle=60.0, reconnect_timeout=max(self.timeout, 30.0), open=False, name="llm-health")
                self._pool_obj.open(wait=False)
                self._pool_pid = os.getpid()
            return self._pool_obj

    def _db(self) -> Db:
        self._guard()
        return PooledReads(self._pool(), self.where)

    def check_identity(self) -> str:
        return self.broken

    def _guard(self) -> None:
        if self.broken:
            raise StateError(self.broken)

    def _pin(self, db: PgDb) -> None:
        """The state id recorded in the database is the one we opened (else: stop, sticky)."""
        try:
            r = db.execute(STATE_ID).fetchone()
        except psycopg.errors.UndefinedTable:
            r = None
        self._check_pin(r)

    def _check_pin(self, r: Any) -> None:
        """The state id in row `r` (None: no row, no table) is the one we opened (else: stop, sticky)."""
        found = "" if r is None else str(r[0])
        if not self.state_id:
            self.state_id = found
        elif found != self.state_id:
            self.broken = (f"state database {self.where} is not the one this remediator opened (state id "
                           f"{self.state_id} -> {found or 'none'}: dropped and created again, or another "
                           "database): stopped, restart the remediator")
            raise StateError(self.broken)

    @contextmanager
    def tx(self) -> Iterator[PgTx]:
        """One write transaction under WRITE_LOCK. BEGIN, the lock and the state id's check go with the
        first round trip, the blind writes with the next read or the COMMIT (conn.py BatchedDb)."""
        self._guard()
        with connection(self._pool(), self.where) as c:
            opening = ["BEGIN", f"SELECT pg_advisory_xact_lock({WRITE_LOCK:d})"]
            pinning = bool(self.state_id)
            if pinning:
                opening.append(STATE_ID)
            pinned = (lambda cur: self._check_pin(cur.fetchone())) if pinning else None
            db = BatchedDb(c, self.where, opening, pinned)
            try:
                yield PgTx(db)
                db.script("COMMIT")
            except BaseException as exc:
                if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        c.execute("ROLLBACK")
                if pinning and isinstance(exc, psycopg.errors.UndefinedTable):
                    problem = self.integrity_problem()     # our tables gone: is it still our database?
                    if problem:
                        raise StateError(problem) from exc
                raise

    @contextmanager
    def reader(self) -> Iterator[PgReads]:
        self._guard()
        with connection(self._pool(), self.where) as c:
            yield PgReads(PgDb(c, self.where))

    def close(self) -> None:
        with self._pool_lock:
            if self._pool_obj is not None and self._pool_pid == os.getpid():
                self._pool_obj.close()
            self._pool_obj = None

    # -- creating, migrating, opening ---------------------------------------------------------------------
    def init(self) -> None:
        """Create or migrate the schema (once, under the write lock, whoever starts first) and pin it."""
        self._wait_reachable()
        with self.tx() as tx:
            db = tx._db()
            schema.migrate(db, self.where)
            self._pin(db)

    def open(self) -> None:
        self.init()

    def _wait_reachable(self) -> None:
        try:
            self._pool().wait(timeout=self.timeout)
        except psycopg_pool.PoolTimeout as exc:
            raise StateError(f"state database {self.where} is not reachable within {self.timeout:g}s "
                             "(remediator.state_timeout): is it running, and are the credentials "
                             "(remediator.state_password_file, PG* variables, ~/.pgpass) right?") from exc

    # -- health ---------------------------------------------------------------------------------------------
    def integrity_problem(self) -> str:
        """'' when the database answers with the state id we opened."""
        try:
            with connection(self._pool(), self.where) as c:      # a read: no write lock taken
                self._pin(PgDb(c, self.where))
        except StateError as exc:
            return str(exc)
        return ""

    def write_problem(self, worker: str) -> str:
        try:
            with self.tx() as tx:
                db = tx._db()
                db.execute("INSERT INTO heartbeat (worker, at, pad) VALUES (?, ?, ?) ON CONFLICT (worker) DO UPDATE "
                           "SET at = excluded.at, pad = excluded.pad", (worker, time.time(), bytes(4096)))
                db.execute("DELETE FROM heartbeat WHERE at < ?", (time.time() - 3600,))
        except StateError as exc:
            return f"state {self.where} is not writable: {exc}"
        except psycopg.Error as exc:
            return f"state {self.where} is not writable: {exc}"
        return ""
