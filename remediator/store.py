"""SQLite state and audit log (WAL; every claim inside BEGIN IMMEDIATE).

Shared by every gunicorn worker: metrics and the API read from here so all workers agree, and the
authority records intent here before it runs an action, so a crash of our own process loses nothing.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llm_health.remediator.policy import Marker

# incident states
OPEN = "open"                # waiting for gates and verification
DRAINING = "draining"        # restart decided; the load balancer drains the backend, no action yet
RESTARTING = "restarting"    # intent recorded, action running
WARMING = "warming"          # action succeeded, waiting for the backend to answer again
NEEDS_ACK = "needs_ack"      # outcome unknown (timeout, crash mid-restart, warm-up timeout): never retried blindly
OBSERVED = "observed"        # nothing more to do (dry run, no action): absorbs alerts until resolved
CLOSED = "closed"
ACTIVE_STATES = (OPEN, DRAINING, RESTARTING, WARMING, NEEDS_ACK, OBSERVED)
#: incident states in which a restart of the backend is under way (the lifecycle belongs to it)
RESTART_STATES = (DRAINING, RESTARTING, WARMING)

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (key TEXT PRIMARY KEY, first_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    backend TEXT NOT NULL,
    state TEXT NOT NULL,
    opened_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    closed_at REAL,
    close_reason TEXT NOT NULL DEFAULT '',
    next_check_at REAL NOT NULL DEFAULT 0,
    last_note TEXT NOT NULL DEFAULT '',
    warm_deadline REAL,
    last_decision TEXT NOT NULL DEFAULT '',
    verified_outcome TEXT NOT NULL DEFAULT '',
    verified_at REAL,
    unresponsive_since REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS one_active_incident ON incidents(backend) WHERE state != 'closed';
CREATE TABLE IF NOT EXISTS incident_alerts (
    incident_id INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    alertname TEXT NOT NULL,
    status TEXT NOT NULL,
    PRIMARY KEY (incident_id, fingerprint, starts_at)
);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL,
    backend TEXT NOT NULL,
    argv TEXT NOT NULL,
    holder TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    result TEXT,
    exit_code INTEGER,
    output TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    backend TEXT NOT NULL DEFAULT '',
    incident_id INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_backend ON events(backend, id);
CREATE TABLE IF NOT EXISTS markers (
    id TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS breaker (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    open INTEGER NOT NULL DEFAULT 0,
    opened_at REAL,
    reason TEXT NOT NULL DEFAULT '',
    reset_at REAL NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO breaker (id) VALUES (1);
CREATE TABLE IF NOT EXISTS lease (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS lifecycle (
    backend TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    since REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    incident_id INTEGER,
    drain_deadline REAL,
    drain_baseline TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    incident_id INTEGER,
    created_at REAL NOT NULL,
    ends_at REAL NOT NULL,
    expired_at REAL,
    result TEXT NOT NULL DEFAULT 'active'
);
CREATE TABLE IF NOT EXISTS counters (
    metric TEXT NOT NULL, label TEXT NOT NULL, value INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (metric, label)
);
"""

#: columns added after the first release: (table, column, declaration), added to older state files
ADDED_COLUMNS = (
    ("incidents", "verified_outcome", "TEXT NOT NULL DEFAULT ''"),   # the authority's latest verification
    ("incidents", "verified_at", "REAL"),
    ("incidents", "unresponsive_since", "REAL"),                     # first of a run of `unresponsive`
)

#: event kinds that are decisions (counted in llm_health_remediator_decisions_total)
DECISION_KINDS = frozenset({
    "deduplicated", "ignored", "signal", "absorbed", "incident_opened",
    "deferred_breaker", "deferred_budget", "deferred_backoff", "deferred_marker", "deferred_unknown",
    "verified_healthy", "restarted_by_other", "restarting", "restarted", "would_restart", "not_configured",
    "failed", "recovered", "warmup_timeout", "interrupted", "aborted", "resolved", "acknowledged", "breaker_open",
    "draining", "deferred_host", "deferred_min_ready", "restart_called_off", "escalated", "lifecycle_refused",
})


class StateError(RuntimeError):
    """The state file cannot be used; we stop rather than start from an empty state."""


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()

    # -- connections and transactions ---------------------------------------------------------------
    def conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            try:
                c = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
                c.row_factory = sqlite3.Row
                c.execute("PRAGMA busy_timeout = 30000")
                c.execute("PRAGMA journal_mode = WAL")
                c.execute("PRAGMA synchronous = FULL")
            except sqlite3.Error as exc:
                raise StateError(f"cannot open state {self.path}: {exc}") from exc
            self._local.conn = c
        return c

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with BEGIN IMMEDIATE so claims never race."""
        c = self.conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")

    def init(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.tx() as c:
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                for table, column, decl in ADDED_COLUMNS:
                    have = {r["name"] for r in c.execute(f"PRAGMA table_info({table})").fetchall()}
                    if column not in have:
                        c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state {self.path} is not usable: {exc}") from exc

    @contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
        """A short-lived read connection, closed afterwards (for threads that come and go, e.g. the
        agent-check handlers, which must not leave a connection behind per connection served)."""
        try:
            c = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise StateError(f"cannot open state {self.path}: {exc}") from exc
        try:
            c.row_factory = sqlite3.Row
            c.execute("PRAGMA busy_timeout = 30000")
            yield c
        finally:
            c.close()

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    # -- audit log and counters ---------------------------------------------------------------------
    @staticmethod
    def event(c: sqlite3.Connection, at: float, kind: str, backend: str = "", incident_id: int | None = None,
              reason: str = "", **detail: Any) -> None:
        c.execute(
            "INSERT INTO events (at, kind, backend, incident_id, reason, detail) VALUES (?,?,?,?,?,?)",
            (at, kind, backend, incident_id, reason[:2000], json.dumps(detail, default=str)[:8000]),
        )
        if kind in DECISION_KINDS:
            Store.bump(c, "decisions", kind)

    @staticmethod
    def bump(c: sqlite3.Connection, metric: str, label: str, by: int = 1) -> None:
        c.execute(
            "INSERT INTO counters (metric, label, value) VALUES (?,?,?) "
            "ON CONFLICT(metric, label) DO UPDATE SET value = value + excluded.value",
            (metric, label, by),
        )

    def events(self, backend: str = "", limit: int = 100, kind: str = "") -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE 1=1"
        args: list[Any] = []
        if backend:
            sql += " AND backend = ?"
            args.append(backend)
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = self.conn().execute(sql, args).fetchall()
        return [{**dict(r), "detail": json.loads(r["detail"] or "{}")} for r in rows]

    def counters(self, metric: str) -> dict[str, int]:
        rows = self.conn().execute("SELECT label, value FROM counters WHERE metric = ?", (metric,)).fetchall()
        return {r["label"]: int(r["value"]) for r in rows}

    # -- incidents ----------------------------------------------------------------------------------
    @staticmethod
    def active_incident(c: sqlite3.Connection, backend: str) -> sqlite3.Row | None:
        return c.execute(
            "SELECT * FROM incidents WHERE backend = ? AND state != 'closed'", (backend,)
        ).fetchone()

    def active_incidents(self) -> list[sqlite3.Row]:
        return self.conn().execute("SELECT * FROM incidents WHERE state != 'closed' ORDER BY id").fetchall()

    def incident(self, incident_id: int) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()

    @staticmethod
    def incident_in(c: sqlite3.Connection, incident_id: int, state: str) -> sqlite3.Row | None:
        """The incident, read inside this transaction, if it is still in `state`; else None (it was
        resolved, acknowledged or moved on while we were working outside the transaction)."""
        row = c.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return row if row is not None and row["state"] == state else None

    @staticmethod
    def set_state(c: sqlite3.Connection, incident_id: int, now: float, state: str, **cols: Any) -> None:
        sets = ["state = ?", "updated_at = ?"]
        args: list[Any] = [state, now]
        if state == CLOSED:
            sets.append("closed_at = ?")
            args.append(now)
        for k, v in cols.items():
            sets.append(f"{k} = ?")
            args.append(v)
        args.append(incident_id)
        c.execute(f"UPDATE incidents SET {', '.join(sets)} WHERE id = ?", args)

    # -- restarts, breaker, markers ----------------------------------------------------------------
    @staticmethod
    def restart_times(c: sqlite3.Connection, backend: str | None, since: float = 0.0,
                      include_dry_run: bool = False) -> tuple[float, ...]:
        sql = "SELECT started_at FROM actions WHERE started_at >= ?"
        args: list[Any] = [since]
        if backend is not None:
            sql += " AND backend = ?"
            args.append(backend)
        if not include_dry_run:
            sql += " AND (result IS NULL OR result != 'dry_run')"
        return tuple(float(r[0]) for r in c.execute(sql, args).fetchall())

    @staticmethod
    def breaker(c: sqlite3.Connection) -> sqlite3.Row:
        return c.execute("SELECT * FROM breaker WHERE id = 1").fetchone()

    @staticmethod
    def api_markers(c: sqlite3.Connection, backend: str) -> tuple[Marker, ...]:
        rows = c.execute("SELECT * FROM markers WHERE backend = ?", (backend,)).fetchall()
        return tuple(Marker(id=r["id"], backend=r["backend"], owner=r["owner"], expires_at=r["expires_at"])
                     for r in rows)
