"""What the store hands out: one frozen dataclass per table, and the incident states.

Callers never see a database row (`sqlite3.Row`, a psycopg tuple): each store maps its rows to these
types, one mapping per table, so code outside the store reads `incident.state`, never a column name.
`as_dict()` gives the record as the API has always shown it (every column, as stored). The rows of rolling
operations (stored commands, rollouts and their members) are in store/rollout_rows.py.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from llm_health.exporter.observation import VerifyOutcome
from llm_health.exporter.reading import Reading
from llm_health.groups import Labels
from llm_health.remediator.lifecycle import LifecycleState


class IncidentState(enum.StrEnum):
    """Where an incident is (stored in `incidents.state` and shown by the API: the values never change)."""

    OPEN = "open"                # waiting for gates and verification
    DRAINING = "draining"        # restart decided; the load balancer drains the backend, no action yet
    RESTARTING = "restarting"    # intent recorded, action running
    WARMING = "warming"          # action succeeded, waiting for the backend to answer again
    NEEDS_ACK = "needs_ack"      # outcome unknown (timeout, crash mid-restart, warm-up timeout): never retried blindly
    OBSERVED = "observed"        # nothing more to do (dry run, no action): absorbs alerts until resolved
    CLOSED = "closed"


ACTIVE_STATES = frozenset(s for s in IncidentState if s != IncidentState.CLOSED)
#: incident states in which a restart of the backend is under way (the lifecycle belongs to it)
RESTART_UNDER_WAY = frozenset({IncidentState.DRAINING, IncidentState.RESTARTING, IncidentState.WARMING})
#: active incident states with no restart of ours under way (a resolved alert closes them at once)
NO_RESTART_UNDER_WAY = frozenset({IncidentState.OPEN, IncidentState.OBSERVED, IncidentState.NEEDS_ACK})
#: incident states a person may acknowledge (POST /api/backends/<name>/ack)
ACKNOWLEDGEABLE = frozenset({IncidentState.NEEDS_ACK, IncidentState.OBSERVED})


class ActionResultKind(enum.StrEnum):
    """`actions.result` beyond what an action's wrapper reports (remediator/action.py)."""

    DRY_RUN = "dry_run"            # a dry run's "would restart": counted by the policy, never executed
    ERROR = "error"                # aborted by an error of the remediator between claim and result
    INTERRUPTED = "interrupted"    # the remediator stopped mid-restart and its outcome cannot be known
    RUNNING = "running"            # shown for an action without a result yet


@dataclass(frozen=True)
class Incident:
    id: int
    backend: str
    state: IncidentState
    opened_at: float
    updated_at: float
    closed_at: float | None = None
    close_reason: str = ""
    next_check_at: float = 0.0                    # monotonic: when to look again
    last_note: str = ""
    warm_deadline: float | None = None            # monotonic
    last_decision: str = ""
    verified_outcome: VerifyOutcome | None = None  # the authority's latest verification (the agent answers from it)
    verified_at: float | None = None
    unresponsive_since: float | None = None       # monotonic: first of the current run of `unresponsive`
    unresponsive_seen_at: float | None = None     # monotonic: the latest `unresponsive`
    labels: Labels = ()                           # group labels of the alert that opened it (cluster, namespace)
    workload: str = ""                            # a workload that replaces its pods ("ReplicaSet/ns/name")
    members: tuple[str, ...] = ()                 # its backends when the restart began
    replacement: str = ""                         # the new pod the incident follows (restart/replacement.py)
    requested_by: str = ""                        # an operator who asked for this restart ('' = an alert did)
    requested_force: bool = False                 # ... past the breaker, budget, markers and min_ready floor
    command: CommandChange | None = None          # a rollout's restart: the command it restarts with (rollout/)

    @property
    def restart_under_way(self) -> bool:
        return self.state in RESTART_UNDER_WAY

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["state"] = self.state.value
        out["verified_outcome"] = self.verified_outcome.value if self.verified_outcome is not None else ""
        out["labels"] = dict(self.labels)
        out["members"] = list(self.members)
        out["command"] = self.command.as_dict() if self.command is not None else None
        return out


@dataclass(frozen=True)
class Action:
    """A restart attempt: its intent is recorded before the argv runs, its result when it is known."""

    id: int
    incident_id: int
    backend: str
    argv: str
    holder: str
    started_at: float                             # wall time (survives a reboot)
    finished_at: float | None = None
    result: str | None = None                     # action.OK ... or ActionResultKind; None while running
    exit_code: int | None = None
    output: str = ""
    status_path: str = ""                         # where the action's wrapper writes its exit status
    started_mono: float | None = None             # monotonic start, on the clock of `boot`
    boot: str = ""


@dataclass(frozen=True)
class LifecycleRow:
    """One backend's lifecycle state (lifecycle.py's table) as stored."""

    backend: str
    state: LifecycleState
    since: float                                  # wall time of the last transition
    reason: str = ""
    incident_id: int | None = None                # the incident whose restart owns the state
    drain_deadline: float | None = None           # monotonic
    drain_baseline: Reading | None = None         # the backend's reading when the drain began

    @property
    def owned(self) -> bool:
        """The state belongs to a restart of ours (not the start-up wait of a backend never seen READY)."""
        return self.incident_id is not None


@dataclass(frozen=True)
class Silence:
    id: str
    backend: str
    incident_id: int | None
    created_at: float
    ends_at: float
    expired_at: float | None = None
    result: str = "active"


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    expires_at: float                             # monotonic, on the clock of `boot`
    boot: str = ""
    epoch: int = 0                                # the term (fencing token): +1 at every takeover


@dataclass(frozen=True)
class BreakerState:
    open: bool = False
    opened_at: float | None = None
    reason: str = ""
    reset_at: float = 0.0
    reset_after_action: int = 0                   # the breaker counts actions with larger ids

    def as_dict(self) -> dict[str, Any]:
        return {"id": 1, "open": int(self.open), "opened_at": self.opened_at, "reason": self.reason,
                "reset_at": self.reset_at, "reset_after_action": self.reset_after_action}


class CaptureResult(enum.StrEnum):
    """How a diagnostics capture before a restart ended (`captures.result`: the values never change)."""

    OK = "ok"                  # exited 0
    FAILED = "failed"          # exited non-zero, or could not start
    TIMEOUT = "timeout"        # killed at diagnostics_timeout: what it wrote so far is kept


@dataclass(frozen=True)
class CaptureRow:
    """What the diagnostics argv found right before the restart of a stuck backend (remediator/diagnostics.py)."""

    id: int
    incident_id: int
    backend: str
    at: float                                     # wall time it began
    argv: str
    result: CaptureResult
    exit_code: int | None
    seconds: float
    output: str = ""
    truncated: bool = False

    def summary(self) -> dict[str, Any]:
        """What the fleet view shows of it (the output itself only to requests with the token)."""
        return {"id": self.id, "at": self.at, "result": self.result.value, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 3), "bytes": len(self.output.encode()), "truncated": self.truncated}

    def as_dict(self) -> dict[str, Any]:
        return {**self.summary(), "incident_id": self.incident_id, "backend": self.backend, "argv": self.argv,
                "output": self.output}


class AdminState(enum.StrEnum):
    """What an operator decided about a backend (stored in `admin.state`: the values never change).

    IN_SERVICE is the state of every backend without an `admin` row. Only an operator command changes it
    (remediator/commands.py), never an alert, a verification or a lifecycle step."""

    IN_SERVICE = "in_service"      # the authority's lifecycle decides alone
    DRAINED = "drained"            # no new requests (the agent answers `drain`) until an operator undrains it
    RETIRED = "retired"            # out of every decision and every count (the agent answers `maint`)


@dataclass(frozen=True)
class AdminRow:
    """An operator's hold on a backend, with who asked and why (NVSentinel's cordon-by/-reason/-timestamp)."""

    backend: str
    state: AdminState
    since: float                                  # wall time of the command
    by: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "since": self.since, "by": self.by, "reason": self.reason}


class Heard(enum.StrEnum):
    """What the remediator last heard from Alertmanager (stored in `heard.what`: the values never change)."""

    WEBHOOK = "webhook"            # any notification accepted at POST /webhook
    WATCHDOG = "watchdog"          # a firing always-on Watchdog in one (remediator/heartbeat.py)


@dataclass(frozen=True)
class LastHeard:
    """When Alertmanager was last heard from (wall time; None: never, in this state file)."""

    webhook_at: float | None = None
    watchdog_at: float | None = None


@dataclass(frozen=True)
class Event:
    """One line of the audit log."""

    id: int
    at: float
    kind: str
    backend: str = ""
    incident_id: int | None = None
    reason: str = ""
    detail: Any = None                            # decoded JSON (details.decode_detail)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- rolling operations (remediator/rollout/; their rows: store/rollout_rows.py) ------------------------------
@dataclass(frozen=True)
class CommandChange:
    """The command a restart changes a backend to, recorded with the restart's intent: `argv` (the new
    command, in the place of the backend's `restart`, or of its `start` for a stop/headroom/start backend),
    or None: back to the command in the configuration (a rollback to a backend that had no stored one)."""

    argv: tuple[str, ...] | None
    rollout_id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv) if self.argv is not None else None, "rollout_id": self.rollout_id}
