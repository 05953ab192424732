"""The SQLite schema and its migrations (`PRAGMA user_version` is the schema version).

A state file records the version of its schema. `migrate()` brings an older file forward, one step per
version, inside the caller's write transaction (init(), in the server's master before it forks); a file
whose version is newer than SCHEMA_VERSION is refused: a newer remediator wrote it, and this one does
not know what its columns mean. Version 0 is every state file from before the version was recorded: its
tables are created if missing and the columns added since the first release are added (ADDED_COLUMNS).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from llm_health.remediator.store.base import StateError

#: the schema this remediator writes; bump it with a new step in MIGRATIONS
SCHEMA_VERSION = 7

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


def _baseline(c: sqlite3.Connection) -> None:
    """Version 1: every table of the first releases, with every column added to them since."""
    for stmt in SCHEMA.split(";"):
        if stmt.strip():
            c.execute(stmt)
    for table, column, decl in ADDED_COLUMNS:
        have = {r["name"] for r in c.execute(f"PRAGMA table_info({table})").fetchall()}
        if column not in have:
            c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def _group_labels(c: sqlite3.Connection) -> None:
    """Version 2: an incident records the group labels (cluster, namespace) of the alert that opened it,
    and, for a pod of a workload that replaces its pods (a ReplicaSet), the workload, its members when the
    restart began and the replacement it follows (remediator/restart/replacement.py)."""
    for column, decl in (("labels", "TEXT NOT NULL DEFAULT '{}'"), ("workload", "TEXT NOT NULL DEFAULT ''"),
                         ("members", "TEXT NOT NULL DEFAULT '[]'"), ("replacement", "TEXT NOT NULL DEFAULT ''")):
        if column not in {r[1] for r in c.execute("PRAGMA table_info(incidents)").fetchall()}:
            c.execute(f"ALTER TABLE incidents ADD COLUMN {column} {decl}")


def _heard(c: sqlite3.Connection) -> None:
    """Version 3: when Alertmanager was last heard from (a webhook, a Watchdog)."""
    c.execute("CREATE TABLE IF NOT EXISTS heard (what TEXT PRIMARY KEY, at REAL NOT NULL)")


def _operators(c: sqlite3.Connection) -> None:
    """Version 4: an operator's hold on a backend (drained, retired), who asked and why; on an incident, the
    operator who asked for its restart (`llm-health ctl restart`); the diagnostics captured before a restart."""
    c.execute("CREATE TABLE IF NOT EXISTS admin (backend TEXT PRIMARY KEY, state TEXT NOT NULL, since REAL NOT NULL, "
              "by TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '')")
    c.execute("CREATE TABLE IF NOT EXISTS captures (id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id INTEGER NOT NULL, "
              "backend TEXT NOT NULL, at REAL NOT NULL, argv TEXT NOT NULL, result TEXT NOT NULL, exit_code INTEGER, "
              "seconds REAL NOT NULL, output TEXT NOT NULL DEFAULT '', truncated INTEGER NOT NULL DEFAULT 0)")
    c.execute("CREATE INDEX IF NOT EXISTS captures_incident ON captures(incident_id, id)")
    for column, decl in (("requested_by", "TEXT NOT NULL DEFAULT ''"), ("requested_force", "INTEGER NOT NULL DEFAULT 0")):
        if column not in {r[1] for r in c.execute("PRAGMA table_info(incidents)").fetchall()}:
            c.execute(f"ALTER TABLE incidents ADD COLUMN {column} {decl}")


def _rollouts(c: sqlite3.Connection) -> None:
    """Version 5: rolling operations (remediator/rollout/): a rollout, its members and their steps, each
    backend's stored command (set by a rollout's restart), and on an incident the command its restart
    changes the backend to."""
    c.execute("CREATE TABLE IF NOT EXISTS rollouts (id INTEGER PRIMARY KEY AUTOINCREMENT, state TEXT NOT NULL, "
              "argv TEXT NOT NULL, canary INTEGER NOT NULL, per_host INTEGER NOT NULL, soak REAL NOT NULL, "
              "gate TEXT NOT NULL, by TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '', "
              "created_at REAL NOT NULL, updated_at REAL NOT NULL, finished_at REAL, note TEXT NOT NULL DEFAULT '')")
    c.execute("CREATE TABLE IF NOT EXISTS rollout_members (rollout_id INTEGER NOT NULL, backend TEXT NOT NULL, "
              "host TEXT NOT NULL DEFAULT '', position INTEGER NOT NULL, canary INTEGER NOT NULL, step TEXT NOT NULL, "
              "argv TEXT NOT NULL, previous TEXT NOT NULL, incident_id INTEGER, changed_at REAL, "
              "soak_started_at REAL, query_errors INTEGER NOT NULL DEFAULT 0, "
              "inconclusive INTEGER NOT NULL DEFAULT 0, note TEXT NOT NULL DEFAULT '', "
              "PRIMARY KEY (rollout_id, backend))")
    # the agent asks every few seconds per backend whether it is a soaking canary (RolloutReads.soaking)
    c.execute("CREATE INDEX IF NOT EXISTS rollout_members_backend ON rollout_members(backend, step)")
    c.execute("CREATE TABLE IF NOT EXISTS commands (backend TEXT PRIMARY KEY, argv TEXT NOT NULL, since REAL NOT NULL, "
              "rollout_id INTEGER)")
    if "command" not in {r[1] for r in c.execute("PRAGMA table_info(incidents)").fetchall()}:
        c.execute("ALTER TABLE incidents ADD COLUMN command TEXT NOT NULL DEFAULT ''")


def _epoch(c: sqlite3.Connection) -> None:
    """Version 6: the lease's term (epoch, a fencing token): every takeover increments it, and the holder
    acts only while the stored epoch is the one it took (remediator/lease.py)."""
    if "epoch" not in {r[1] for r in c.execute("PRAGMA table_info(lease)").fetchall()}:
        c.execute("ALTER TABLE lease ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")


def _deliveries_by_age(c: sqlite3.Connection) -> None:
    """Version 7: deliveries by age. Every notification forgets the deliveries older than twice the dedup
    window (IncidentWrites.remember_delivery): without the index that DELETE read the whole table, inside
    the write transaction, so a storm's notifications each took longer than the one before."""
    c.execute(DELIVERIES_BY_AGE)


DELIVERIES_BY_AGE = "CREATE INDEX IF NOT EXISTS deliveries_first_seen ON deliveries(first_seen)"

#: (version, step): the step brings a state file of version - 1 to `version`
MIGRATIONS: tuple[tuple[int, Callable[[sqlite3.Connection], None]], ...] = (
    (1, _baseline),
    (2, _group_labels),
    (3, _heard),
    (4, _operators),
    (5, _rollouts),
    (6, _epoch),
    (7, _deliveries_by_age),
)


def version_of(c: sqlite3.Connection) -> int:
    return int(c.execute("PRAGMA user_version").fetchone()[0])


def refuse_newer(found: int, path: str) -> None:
    if found > SCHEMA_VERSION:
        raise StateError(f"state schema {found} is newer than this remediator knows ({SCHEMA_VERSION}): "
                         f"{path} was written by a newer llm-health; run that version (or restore a backup "
                         "taken before the upgrade)")


def migrate(c: sqlite3.Connection, path: str) -> int:
    """Bring the schema to SCHEMA_VERSION inside the caller's transaction; returns the version found."""
    found = version_of(c)
    refuse_newer(found, path)
    for version, step in MIGRATIONS:
        if found < version:
            step(c)
    if found < SCHEMA_VERSION:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return found
