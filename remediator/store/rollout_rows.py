"""What the store hands out about rolling operations (remediator/rollout/): a backend's stored command, a
rollout and its members, and their steps (store/rows.py says how rows become these types)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CommandRow:
    """A backend's stored command (`commands`): set by a rollout's restart, it replaces the configured one
    for every later restart of the backend until another rollout changes it. No row: the configuration's."""

    backend: str
    argv: tuple[str, ...]
    since: float                                  # wall time of the restart that set it
    rollout_id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "argv": list(self.argv), "since": self.since, "rollout_id": self.rollout_id}


class RolloutState(enum.StrEnum):
    """Where a rollout is (stored in `rollouts.state`: the values never change)."""

    RUNNING = "running"            # restarting members (the canary first), soaking the canary
    PAUSED = "paused"              # an operator paused it: nothing new starts; what runs finishes
    ROLLING_BACK = "rolling_back"  # a gate failed or an operator aborted: the changed members go back
    SUCCEEDED = "succeeded"        # every member runs the new command
    ROLLED_BACK = "rolled_back"    # every changed member runs its previous command again
    FAILED = "failed"              # a rollback could not be completed: needs a person
    ACKNOWLEDGED = "acknowledged"  # failed, and a person said it is repaired (ctl rollout ack)


ACTIVE_ROLLOUT_STATES = frozenset({RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.ROLLING_BACK})


class MemberStep(enum.StrEnum):
    """Where one backend of a rollout is (stored in `rollout_members.step`)."""

    PENDING = "pending"            # not changed yet
    RESTARTING = "restarting"      # its restart with the new command was asked for (incident_id)
    SOAKING = "soaking"            # a canary, restarted, watched by the gate since soak_started_at
    DONE = "done"                  # runs the new command
    ROLLING_BACK = "rolling_back"  # its restart with the previous command was asked for
    ROLLED_BACK = "rolled_back"    # runs the previous command again (or was never changed)
    FAILED = "failed"              # its restart with the new command did not end READY (the note says why)
    ROLLBACK_FAILED = "rollback_failed"   # its restart with the previous command did not end READY: a person


#: steps of a member that runs (or may run) the new command: a rollback restarts these
CHANGED_STEPS = frozenset({MemberStep.RESTARTING, MemberStep.SOAKING, MemberStep.DONE, MemberStep.FAILED})


@dataclass(frozen=True)
class RolloutMember:
    rollout_id: int
    backend: str
    host: str
    position: int                                 # the order of the rollout (the canaries first)
    canary: bool
    step: MemberStep
    argv: tuple[str, ...]                         # the new command for this backend (placeholders filled)
    previous: tuple[str, ...] | None              # its command before the rollout (None: the configuration's)
    incident_id: int | None = None                # the restart (new command, or the rollback) asked for
    changed_at: float | None = None               # wall time the step was entered
    soak_started_at: float | None = None          # wall time the canary's soak began
    query_errors: int = 0                         # consecutive failed gate queries
    inconclusive: int = 0                         # consecutive gate measurements without an answer
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["step"] = self.step.value
        out["argv"] = list(self.argv)
        out["previous"] = list(self.previous) if self.previous is not None else None
        return out


@dataclass(frozen=True)
class Rollout:
    id: int
    state: RolloutState
    argv: tuple[str, ...]                         # the command as asked for ({backend}, {host}, ... placeholders)
    canary: int
    per_host: int
    soak: float                                   # seconds
    gate: dict[str, Any]                          # the gate's bounds (rollout/gate.py Bounds.as_dict)
    by: str
    reason: str
    created_at: float
    updated_at: float
    finished_at: float | None = None
    note: str = ""                                # why it waits, what the gate said, why it stopped

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_ROLLOUT_STATES

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["state"] = self.state.value
        out["argv"] = list(self.argv)
        return out
