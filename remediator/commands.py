"""What an operator command does to one backend, decided from facts: pure, no I/O, no clock of its own.

The commands (`llm-health ctl ...`, POST /api/backends/<name>/<command>) and what each does in each
operator state (AdminState) of the backend:

| command  | in service                          | drained                 | retired                     |
|----------|-------------------------------------|-------------------------|-----------------------------|
| drain    | -> drained (floor, unless --force)  | nothing to do           | refused: activate it first  |
| undrain  | nothing to do                       | -> in service           | refused: use activate       |
| retire   | -> retired (floor, unless --force)  | -> retired              | nothing to do               |
| activate | nothing to do                       | -> in service           | -> in service               |
| restart  | a restart asked for by hand         | the same (stays drained)| refused: activate it first  |

* The floor: taking a *serving* backend out (lifecycle READY and in service) needs at least `min_ready`
  OTHER backends READY and in service, the same rule an automatic restart follows (lifecycle.may_drain);
  `--force` overrides it and the event says so. A backend that serves nothing (not READY, or drained)
  costs no capacity.
* Retire of a member its active rollout may still restart (the next ones, and the changed ones should it
  roll back) is refused unless forced: the rollout would ask for the retired backend's restart and fail.
  Retire while a restart of ours is under way is refused (the restart holds the backend's lifecycle and its
  host's mutex) unless forced: the restart then finishes and the backend stays out. Retiring closes an
  incident that waits (open, observed, needs_ack): a retired backend is out of every decision.
* restart asks the authority for a restart (an incident `requested_by` the operator: remediator/restart/
  requested.py): refused while one is under way, while a rollout's restart with another command is asked
  for and has not begun, or when no restart action is configured; the authority
  then drains, restarts and warms it up under the per-host mutex, the concurrency bound and, unless
  forced, the breaker, the budget, busy markers and the floor (deferrals are audited and retried).
* Nothing here changes the lifecycle: a drained or retired backend keeps its state, and the HAProxy agent
  answers `drain` or `maint` for it (remediator/agent.py) until an operator puts it back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.store.rows import RESTART_UNDER_WAY, AdminState, IncidentState

A = AdminState


class Command(enum.StrEnum):
    DRAIN = "drain"
    UNDRAIN = "undrain"
    RETIRE = "retire"
    ACTIVATE = "activate"
    RESTART = "restart"


class Refusal(enum.StrEnum):
    """Why a command was refused (nothing changed): the API answers 409 with it."""

    CONFLICT = "conflict"          # the backend's operator state does not allow it
    FLOOR = "min_ready"            # it would take out a serving backend below the floor
    RESTARTING = "restarting"      # a restart of ours holds the backend
    NOT_CONFIGURED = "not_configured"   # restart: the backend has no restart action


@dataclass(frozen=True)
class CommandFacts:
    admin: AdminState
    lifecycle: LifecycleState
    incident: IncidentState | None          # the backend's active incident, if any
    ready_others: int                       # OTHER backends READY and in service
    min_ready: int
    force: bool = False
    restart_configured: bool = True
    #: the active incident is a restart that changes the backend's command (a rollout's, or its rollback's):
    #: the rollout's id ("" for a rollback's), else None
    command_change: str | None = None
    #: an active rollout that may still restart this member ("rollout 4 (running; b2 pending)"), or ""
    rollout_member: str = ""


@dataclass(frozen=True)
class Plan:
    """The command's outcome: refused (with why), nothing to do, or a new operator state."""

    target: AdminState | None               # None: nothing changes
    reason: str
    refused: Refusal | None = None
    forced: bool = False                    # --force overrode a rule (the event says which)
    close_incident: bool = False            # the waiting incident ends with the command
    request_restart: bool = False           # the authority is asked for a restart (an incident requested_by)

    @property
    def changes(self) -> bool:
        return self.refused is None and (self.target is not None or self.request_restart)


def serving(f: CommandFacts) -> bool:
    return f.lifecycle == LifecycleState.READY and f.admin == A.IN_SERVICE


def _floor(f: CommandFacts, what: str) -> Plan | None:
    """None when taking the backend out is fine (or forced); else the refusal."""
    if not serving(f) or f.ready_others >= f.min_ready:
        return None
    if f.force:
        return None
    return Plan(None, f"{what} would leave only {f.ready_others} other backend(s) READY and in service "
                f"(remediator.min_ready {f.min_ready}); --force does it anyway", Refusal.FLOOR)


def _forced_floor(f: CommandFacts) -> bool:
    return f.force and serving(f) and f.ready_others < f.min_ready


def plan(command: Command, f: CommandFacts) -> Plan:
    if command == Command.DRAIN:
        if f.admin == A.RETIRED:
            return Plan(None, "retired: activate it first", Refusal.CONFLICT)
        if f.admin == A.DRAINED:
            return Plan(None, "already drained")
        return _floor(f, "draining it") or Plan(
            A.DRAINED, "drained: no new requests until an operator undrains it", forced=_forced_floor(f))
    if command == Command.UNDRAIN:
        if f.admin == A.RETIRED:
            return Plan(None, "retired: use activate to put it back", Refusal.CONFLICT)
        if f.admin == A.IN_SERVICE:
            return Plan(None, "not drained")
        return Plan(A.IN_SERVICE, "undrained: takes requests again while its lifecycle is READY")
    if command == Command.RETIRE:
        if f.admin == A.RETIRED:
            return Plan(None, "already retired")
        if f.rollout_member and not f.force:
            # a rollout asks for a retired member's restart, which is refused, and the rollout rolls back
            return Plan(None, f"a member of {f.rollout_member} that its rollout may still restart: wait for the "
                        "rollout to end (or abort it and wait for its rollback), or --force (the rollout then "
                        "fails)", Refusal.CONFLICT)
        restarting = f.incident in RESTART_UNDER_WAY
        if restarting and not f.force:
            return Plan(None, f"a restart of ours is under way (incident {f.incident}); retire it when it is "
                        "done, drain it now, or --force (the restart finishes, the backend stays out)",
                        Refusal.RESTARTING)
        refused = _floor(f, "retiring it")
        if refused is not None:
            return refused
        waiting = f.incident is not None and not restarting
        return Plan(A.RETIRED, "retired: out of every decision and count until an operator activates it",
                    forced=_forced_floor(f) or restarting, close_incident=waiting)
    if command == Command.ACTIVATE:
        if f.admin == A.IN_SERVICE:
            return Plan(None, "already in service")
        return Plan(A.IN_SERVICE, f"activated (was {f.admin.value}): the authority's lifecycle decides again")
    if command == Command.RESTART:
        if f.admin == A.RETIRED:
            return Plan(None, "retired: activate it first", Refusal.CONFLICT)
        if not f.restart_configured:
            return Plan(None, "no restart action is configured for this backend", Refusal.NOT_CONFIGURED)
        if f.incident in RESTART_UNDER_WAY:
            return Plan(None, f"a restart is already under way (incident {f.incident})", Refusal.RESTARTING)
        if f.command_change is not None:
            # asked for by a rollout and not begun yet: a restart by hand would take its incident over and
            # run the old command, and the rollout would count it as its own (a canary soaked on the old one)
            which = f"rollout {f.command_change}" if f.command_change else "a rollout's rollback"
            return Plan(None, f"{which} asked for this backend's restart with another command; it has not begun: "
                        "wait for it, or abort the rollout first", Refusal.CONFLICT)
        forced = " (forced: past the breaker, budget, busy markers and min_ready floor)" if f.force else ""
        return Plan(None, f"restart asked for{forced}: the authority drains, restarts and warms it up under its "
                    "rules (see ctl status and the audit log)", request_restart=True, forced=f.force)
    raise ValueError(f"unknown command {command!r}")
