"""SQLite state and audit log (WAL; every claim inside BEGIN IMMEDIATE).

Shared by every gunicorn worker: metrics and the API read from here so all workers agree, and the
authority records intent here before it runs an action, so a crash of our own process loses nothing.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llm_health.remediator import state_traces
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
CREATE TABLE IF NOT EXISTS resolved_alerts (
    fingerprint TEXT NOT NULL, starts_at TEXT NOT NULL, resolved_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, starts_at)
);
CREATE TABLE IF NOT EXISTS heartbeat (worker TEXT PRIMARY KEY, at REAL NOT NULL, pad BLOB);
CREATE INDEX IF NOT EXISTS actions_finished ON actions(finished_at);
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
    ("actions", "status_path", "TEXT NOT NULL DEFAULT ''"),          # where the action's wrapper writes its exit
    ("lease", "boot", "TEXT NOT NULL DEFAULT ''"),                   # boot id of the monotonic clock in expires_at
    ("actions", "started_mono", "REAL"),                             # monotonic start (budget/backoff/breaker age)
    ("actions", "boot", "TEXT NOT NULL DEFAULT ''"),                 # ... on this boot's monotonic clock
    ("breaker", "reset_after_action", "INTEGER NOT NULL DEFAULT 0"),  # the breaker counts actions with larger ids
    ("incidents", "unresponsive_seen_at", "REAL"),                   # monotonic time of the latest `unresponsive`
)

#: event kinds that are decisions (counted in llm_health_remediator_decisions_total)
DECISION_KINDS = frozenset({
    "deduplicated", "ignored", "signal", "absorbed", "incident_opened", "verified_asleep",
    "deferred_breaker", "deferred_budget", "deferred_backoff", "deferred_marker", "deferred_unknown",
    "verified_healthy", "restarted_by_other", "restarting", "restarted", "would_restart", "not_configured",
    "failed", "recovered", "warmup_timeout", "interrupted", "aborted", "resolved", "acknowledged", "breaker_open",
    "draining", "deferred_host", "deferred_min_ready", "restart_called_off", "escalated", "lifecycle_refused",
    "stale_firing", "deferred_concurrency",
})

#: an event's detail is at most this long once encoded; values are shortened BEFORE encoding
DETAIL_LIMIT = 8000
_VALUE_LIMIT = 1000      # characters of one string value in a detail
_ITEMS_LIMIT = 40        # entries of one list or mapping in a detail
_DEPTH_LIMIT = 6


def clip(value: Any, depth: int = 0) -> Any:
    """A JSON-encodable copy of `value` with long strings, lists, mappings and deep nesting cut
    (marked with an ellipsis); lone surrogates are replaced. Encoding the result never needs cutting."""
    if isinstance(value, str):
        text = value if len(value) <= _VALUE_LIMIT else value[:_VALUE_LIMIT] + "…"
        return text.encode("utf-8", "replace").decode("utf-8")
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= _DEPTH_LIMIT:
        return clip(str(value)[:200], depth)
    if isinstance(value, dict):
        items = list(value.items())
        out = {clip(str(k))[:200]: clip(v, depth + 1) for k, v in items[:_ITEMS_LIMIT]}
        if len(items) > _ITEMS_LIMIT:
            out["…"] = f"{len(items) - _ITEMS_LIMIT} more"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = list(value)
        out_list = [clip(v, depth + 1) for v in seq[:_ITEMS_LIMIT]]
        if len(seq) > _ITEMS_LIMIT:
            out_list.append(f"… {len(seq) - _ITEMS_LIMIT} more")
        return out_list
    return clip(str(value), depth)


def encode_detail(detail: dict[str, Any]) -> str:
    """Always valid JSON of at most DETAIL_LIMIT characters."""
    text = json.dumps(clip(detail))
    if len(text) <= DETAIL_LIMIT:
        return text
    # still too long (many long values): keep a readable preview as one string value
    return json.dumps({"truncated": True, "preview": text[: DETAIL_LIMIT // 2]})


def decode_detail(raw: str | None) -> Any:
    """Stored details from any version (older ones were cut after encoding) never break a reader."""
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return {"unreadable": (raw or "")[:2000]}


def file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class StateError(RuntimeError):
    """The state file cannot be used; we stop rather than start from an empty state."""


class Store:
    """The state file, pinned to the file it first opened.

    Once opened (init(), or the first connection) the store remembers the file's device and inode.
    It never creates a database after that: new connections open the existing file only
    (`mode=rw`), and every connection and write transaction first checks that the path still names
    the same file. A state file deleted or replaced behind our back raises StateError, so the
    authority stops acting at once instead of going on with a second, empty store.
    """

    def __init__(self, path: str | Path, *, expect: tuple[int, int] | None = None) -> None:
        self.path = str(path)
        self._local = threading.local()
        self.identity: tuple[int, int] | None = expect
        self.broken = ""        # why the store stopped (deleted/replaced): sticky

    # -- connections and transactions ---------------------------------------------------------------
    def check_identity(self) -> str:
        """'' while the path names the file we opened; else why not (sticky)."""
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
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with BEGIN IMMEDIATE so claims never race."""
        self._guard()
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
        if self.identity is None and not os.path.lexists(self.path):
            found = state_traces.traces(Path(self.path))
            if found:     # it existed and is gone: never replaced by an empty one without a word
                raise StateError(state_traces.missing_state_message(Path(self.path), found))
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
        problem = self.integrity_problem()
        if problem:
            raise StateError(f"state {self.path} fails its integrity check: {problem} (restore a backup, or "
                             f"move the file away together with {state_traces.id_file(Path(self.path))} to start "
                             "over; the remediator does not start on a damaged state)")
        try:
            state_traces.write_id(Path(self.path))
        except OSError as exc:
            raise StateError(f"cannot write {state_traces.id_file(Path(self.path))}: {exc}") from exc

    # -- health -----------------------------------------------------------------------------------------
    def integrity_problem(self) -> str:
        """'' when `PRAGMA quick_check` passes on a fresh connection (no cached pages), else its report."""
        try:
            with self.reader() as c:
                rows = [str(r[0]) for r in c.execute("PRAGMA quick_check(5)").fetchall()]
        except (sqlite3.Error, StateError) as exc:
            return str(exc)
        return "" if rows == ["ok"] else "; ".join(rows)[:500]

    def write_problem(self, worker: str) -> str:
        """'' when a small committed write (a heartbeat row with a page of padding) succeeds: catches a
        full disk, a read-only file or file system, a locked or damaged database."""
        try:
            with self.tx() as c:
                c.execute("INSERT INTO heartbeat (worker, at, pad) VALUES (?, ?, zeroblob(4096)) "
                          "ON CONFLICT(worker) DO UPDATE SET at = excluded.at, pad = excluded.pad",
                          (worker, time.time()))
                c.execute("DELETE FROM heartbeat WHERE at < ?", (time.time() - 3600,))
        except (sqlite3.Error, StateError, OSError) as exc:
            return f"state {self.path} is not writable: {exc}"
        return ""

    # -- retention -------------------------------------------------------------------------------------
    @staticmethod
    def prune(c: sqlite3.Connection, now: float, *, max_age: float, max_events: int, max_actions: int,
              protect: float) -> dict[str, int]:
        """Forget old history: events and finished actions older than `max_age`, or beyond the newest
        `max_events` / `max_actions`. Running actions, active incidents and actions started within
        `protect` seconds (the budget, breaker and backoff windows read them) are never removed. Pruned
        actions are added to the `restarts_pruned` counters so restarts_total never goes down."""
        out = {}
        out["events"] = c.execute("DELETE FROM events WHERE at < ? OR id <= (SELECT id FROM events ORDER BY id DESC "
                                  "LIMIT 1 OFFSET ?)", (now - max_age, max_events)).rowcount
        doomed = ("FROM actions WHERE finished_at IS NOT NULL AND started_at < ? AND (finished_at < ? OR id <= "
                  "(SELECT id FROM actions WHERE finished_at IS NOT NULL ORDER BY id DESC LIMIT 1 OFFSET ?))")
        args = (now - protect, now - max_age, max_actions)
        for r in c.execute(f"SELECT backend, coalesce(result, 'running') AS result, count(*) AS n {doomed} "
                           "GROUP BY 1, 2", args).fetchall():
            Store.bump(c, "restarts_pruned", f"{r['backend']}\t{r['result']}", int(r["n"]))
        out["actions"] = c.execute(f"DELETE {doomed}", args).rowcount
        out["incidents"] = c.execute(
            "DELETE FROM incidents WHERE state = 'closed' AND closed_at < ?", (now - max_age,)).rowcount
        c.execute("DELETE FROM incident_alerts WHERE incident_id NOT IN (SELECT id FROM incidents)")
        c.execute("DELETE FROM resolved_alerts WHERE resolved_at < ?", (now - max_age,))
        out["markers"] = c.execute("DELETE FROM markers WHERE expires_at < ?", (now - 3600,)).rowcount
        c.execute("DELETE FROM silences WHERE result != 'active' AND created_at < ?", (now - max_age,))
        return out

    @contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
        """A short-lived read connection, closed afterwards (for threads that come and go, e.g. the
        agent-check handlers, which must not leave a connection behind per connection served)."""
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
            (at, kind, backend, incident_id, reason[:2000].encode("utf-8", "replace").decode(), encode_detail(detail)),
        )
        if kind in DECISION_KINDS:
            Store.bump(c, "decisions", kind)

    @staticmethod
    def event_unless_recent(c: sqlite3.Connection, at: float, kind: str, backend: str, reason: str,
                            within: float, **detail: Any) -> bool:
        """Record the event unless the same (kind, backend, reason) was recorded within `within` seconds
        (a condition seen on every refresh is audited once, and again only while it lasts)."""
        seen = c.execute("SELECT 1 FROM events WHERE backend = ? AND kind = ? AND reason = ? AND at > ? LIMIT 1",
                         (backend, kind, reason[:2000], at - within)).fetchone()
        if seen is not None:
            return False
        Store.event(c, at, kind, backend, None, reason, **detail)
        return True

    @staticmethod
    def bump(c: sqlite3.Connection, metric: str, label: str, by: int = 1) -> None:
        c.execute(
            "INSERT INTO counters (metric, label, value) VALUES (?,?,?) "
            "ON CONFLICT(metric, label) DO UPDATE SET value = value + excluded.value",
            (metric, label, by),
        )

    def events(self, backend: str = "", limit: int = 100, kind: str = "",
               before: int | None = None) -> list[dict[str, Any]]:
        """Newest first; `before`: only events with a smaller id (the next page)."""
        sql = "SELECT * FROM events WHERE 1=1"
        args: list[Any] = []
        if before is not None:
            sql += " AND id < ?"
            args.append(before)
        if backend:
            sql += " AND backend = ?"
            args.append(backend)
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = self.conn().execute(sql, args).fetchall()
        return [{**dict(r), "detail": decode_detail(r["detail"])} for r in rows]

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
                      include_dry_run: bool = False, *, now: float | None = None, mono: float | None = None,
                      boot: str = "", after_action: int | None = None) -> tuple[float, ...]:
        """When the restarts of `backend` (None: every backend) started, as wall times for the policy.

        With `now` and `mono` (this look's wall and monotonic time) a restart recorded on this boot is
        placed by its monotonic age (`now - (mono - started_mono)`), so a step of the wall clock moves
        neither the budget, the backoff nor the breaker window; one from another boot keeps its wall time
        (all there is). `after_action`: only actions with a larger id (the breaker's reset point: ids,
        unlike clocks, never step); otherwise `since` filters on the wall start."""
        sql = "SELECT started_at, started_mono, boot FROM actions WHERE "
        if after_action is not None:
            sql += "id > ?"
            args: list[Any] = [after_action]
        else:
            sql += "started_at >= ?"
            args = [since]
        if backend is not None:
            sql += " AND backend = ?"
            args.append(backend)
        if not include_dry_run:
            sql += " AND (result IS NULL OR result != 'dry_run')"
        out: list[float] = []
        for r in c.execute(sql, args).fetchall():
            same_boot = boot and r["boot"] == boot and r["started_mono"] is not None
            if now is not None and mono is not None and same_boot:
                out.append(now - (mono - float(r["started_mono"])))
            else:
                out.append(float(r["started_at"]))
        return tuple(out)

    @staticmethod
    def breaker(c: sqlite3.Connection) -> sqlite3.Row:
        return c.execute("SELECT * FROM breaker WHERE id = 1").fetchone()

    @staticmethod
    def api_markers(c: sqlite3.Connection, backend: str) -> tuple[Marker, ...]:
        rows = c.execute("SELECT * FROM markers WHERE backend = ?", (backend,)).fetchall()
        return tuple(Marker(id=r["id"], backend=r["backend"], owner=r["owner"], expires_at=r["expires_at"])
                     for r in rows)

    @staticmethod
    def restarts_in_progress(c: sqlite3.Connection, except_incident: int | None = None,
                             warming_until: float = float("inf")) -> int:
        """Restarts holding a slot of the concurrency bound, fleet-wide; read inside the claim's transaction,
        so the bound holds across threads and processes. A slot is held by a drain, by a running restart
        action, and by a warm-up whose deadline (`warm_deadline`, monotonic) is after `warming_until`,
        i.e. for its first part only; never by the restart of a backend verified `down` (it served nothing,
        so restarting it takes no capacity away; the breaker and the host mutex still bound it)."""
        return int(c.execute(
            "SELECT count(*) FROM incidents WHERE id != ? AND ("
            " state = ? OR (state = ? AND verified_outcome != 'down')"
            " OR (state = ? AND verified_outcome != 'down' AND coalesce(warm_deadline, 0) > ?))",
            (-1 if except_incident is None else except_incident, DRAINING, RESTARTING, WARMING, warming_until),
        ).fetchone()[0])
