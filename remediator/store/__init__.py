"""The remediator's state: the only code that knows a database.

* base.py: the contract (`StateStore`, `Transaction`, `Reads`): domain verbs, typed rows, no SQL;
* rows.py: the rows (frozen dataclasses) and `IncidentState`;
* details.py, shared.py: what every store does alike (event details; verbs built on primitives);
* tables/: the SQL, one module per table, written once in the dialect both stores speak;
* sqlite/: the store on SQLite (the embedded default): the file, its transactions, schema and migrations;
* postgresql/: the store on PostgreSQL (several remediators, one state): the pool, its transactions,
  schema, and the database's clock for the lease.

Everything else in the remediator imports from here, never from a driver.
"""

import os
from pathlib import Path

from llm_health.config import Config, is_database_url
from llm_health.remediator.store.base import Reads, StateError, StateStore, Transaction
from llm_health.remediator.store.rollout_rows import (
    ACTIVE_ROLLOUT_STATES,
    CHANGED_STEPS,
    CommandRow,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
)
from llm_health.remediator.store.rows import (
    ACKNOWLEDGEABLE,
    ACTIVE_STATES,
    NO_RESTART_UNDER_WAY,
    RESTART_UNDER_WAY,
    Action,
    ActionResultKind,
    AdminRow,
    AdminState,
    BreakerState,
    CaptureResult,
    CaptureRow,
    CommandChange,
    Event,
    Heard,
    Incident,
    IncidentState,
    LastHeard,
    Lease,
    LifecycleRow,
    Silence,
)
from llm_health.remediator.store.sqlite import SqliteStore

__all__ = [
    "ACKNOWLEDGEABLE", "ACTIVE_ROLLOUT_STATES", "ACTIVE_STATES", "CHANGED_STEPS", "CommandChange", "CommandRow",
    "MemberStep", "Rollout", "RolloutMember", "RolloutState", "NO_RESTART_UNDER_WAY", "RESTART_UNDER_WAY", "Action", "ActionResultKind",
    "AdminRow", "AdminState", "CaptureResult", "CaptureRow",
    "BreakerState", "Event", "Heard", "Incident", "IncidentState", "LastHeard", "Lease", "LifecycleRow", "Reads",
    "Silence", "SqliteStore", "StateError", "StateStore", "Transaction", "local_base", "state_path", "state_where",
    "store_for",
]


def state_path(config: Config) -> Path:
    """The configured SQLite state file (remediator.state), resolved against the config's folder."""
    if is_database_url(config.remediator.state):
        raise ValueError("remediator.state is a database URL, not a file")
    return config.resolve_path(config.remediator.state)


def local_base(config: Config) -> Path:
    """Where this remediator keeps its local files (action status files, diagnostics): remediator.local_dir,
    else beside the SQLite file, else (PostgreSQL) var/remediator under the config's folder. Names are
    <base>.actions, <base>.diagnostics."""
    r = config.remediator
    if r.local_dir:
        return config.resolve_path(r.local_dir) / "remediator"
    if is_database_url(r.state):
        return config.resolve_path("var") / "remediator"
    return state_path(config)


def state_where(config: Config) -> str:
    """What remediator.state names, for messages and comparisons: the absolute file, or the database URL
    (which never carries a password: the config refuses one)."""
    if is_database_url(config.remediator.state):
        return config.remediator.state
    return os.path.abspath(state_path(config))


def store_for(config: Config, *, expect: tuple[int, int] | None = None) -> StateStore:
    """The store the configuration names. `expect`: (device, inode) of the state file the server's master
    created and checked before forking; a worker then uses exactly that file (SQLite)."""
    r = config.remediator
    if is_database_url(r.state):
        try:
            from llm_health.remediator.store.postgresql import PostgresStore
        except ImportError as exc:
            raise StateError(f"remediator.state is a PostgreSQL URL, and psycopg is not installed ({exc}): "
                             "pip install 'llm-health[postgresql]'") from exc
        password = None
        if r.state_password_file:
            try:
                password = config.resolve_path(r.state_password_file).read_text().strip()
            except OSError as exc:
                raise StateError(f"remediator.state_password_file: cannot read it: {exc}") from exc
        return PostgresStore(r.state, password=password, timeout=r.state_timeout)
    return SqliteStore(state_path(config), expect=expect)
