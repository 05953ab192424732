"""The remediator's state: the only code that knows a database.

* base.py: the contract (`StateStore`, `Transaction`, `Reads`): domain verbs, typed rows, no SQL;
* rows.py: the rows (frozen dataclasses) and `IncidentState`;
* details.py, shared.py: what every store does alike (event details; verbs built on primitives);
* sqlite/: the store on SQLite, one module per table, the schema and its migrations.

Everything else in the remediator imports from here, never from a driver.
"""

from pathlib import Path

from llm_health.config import Config
from llm_health.remediator.store.base import Reads, StateError, StateStore, Transaction
from llm_health.remediator.store.rows import (
    ACKNOWLEDGEABLE,
    ACTIVE_ROLLOUT_STATES,
    ACTIVE_STATES,
    CHANGED_STEPS,
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
    CommandRow,
    Event,
    Heard,
    Incident,
    IncidentState,
    LastHeard,
    Lease,
    LifecycleRow,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
    Silence,
)
from llm_health.remediator.store.sqlite import SqliteStore

__all__ = [
    "ACKNOWLEDGEABLE", "ACTIVE_ROLLOUT_STATES", "ACTIVE_STATES", "CHANGED_STEPS", "CommandChange", "CommandRow",
    "MemberStep", "Rollout", "RolloutMember", "RolloutState", "NO_RESTART_UNDER_WAY", "RESTART_UNDER_WAY", "Action", "ActionResultKind",
    "AdminRow", "AdminState", "CaptureResult", "CaptureRow",
    "BreakerState", "Event", "Heard", "Incident", "IncidentState", "LastHeard", "Lease", "LifecycleRow", "Reads",
    "Silence", "SqliteStore", "StateError", "StateStore", "Transaction", "state_path", "store_for",
]


def state_path(config: Config) -> Path:
    """The configured state file (remediator.state), resolved against the config's folder."""
    return config.resolve_path(config.remediator.state)


def store_for(config: Config, *, expect: tuple[int, int] | None = None) -> SqliteStore:
    """The store the configuration names. `expect`: (device, inode) of the state file the server's master
    created and checked before forking; a worker then uses exactly that file."""
    return SqliteStore(state_path(config), expect=expect)
