"""Carry out an operator command: the facts, the plan (commands.plan) and its record in ONE transaction.

The facts the floor is judged from (every backend's lifecycle and operator state) are read in the same
write transaction that records the new state, so two commands at once (two operators, two gunicorn workers,
two remediators on one store) cannot both take the last backends out. Every command is audited, refused
or not, with who asked and why (`operator_<command>` events; `operator_refused` for a refusal).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_health.config import Config
from llm_health.remediator import lifecycle
from llm_health.remediator.commands import Command, CommandFacts, Plan, plan
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.notes import HELD
from llm_health.remediator.restart.requested import stale_rollout
from llm_health.remediator.sequence import has_restart
from llm_health.remediator.store import (
    RESTART_UNDER_WAY,
    AdminState,
    Incident,
    IncidentState,
    MemberStep,
    RolloutState,
    StateStore,
    Transaction,
)

S = LifecycleState


@dataclass(frozen=True)
class Request:
    command: Command
    backend: str
    by: str                   # who asked (the CLI sends user@host)
    reason: str
    force: bool = False


def facts(tx: Transaction, config: Config, req: Request) -> CommandFacts:
    lifecycles = tx.lifecycles()
    admins = tx.admins()
    # the same states the authority's min_ready floor counts (held backends serve nothing)
    states = lifecycle.gate_states(lifecycles, [b.name for b in config.backends], admins)
    ready_others = sum(1 for name, st in states.items() if name != req.backend and st == S.READY)
    inc = tx.active_incident(req.backend)
    backend = config.backend(req.backend)
    held = admins.get(req.backend)
    own = lifecycles.get(req.backend)
    return CommandFacts(admin=held.state if held is not None else AdminState.IN_SERVICE,
                        lifecycle=own.state if own is not None else lifecycle.UNSEEN,
                        incident=inc.state if inc is not None else None, ready_others=ready_others,
                        min_ready=config.remediator.min_ready, force=req.force,
                        restart_configured=backend is not None and has_restart(backend),
                        command_change=_command_change(tx, inc), rollout_member=_rollout_member(tx, req.backend))


#: a member in these steps may still be restarted by its rollout: the next ones while it runs (or is
#: paused), and the changed ones if it rolls back; a retired backend's restart is refused, and the rollout
#: then fails (rolls back, or ends `failed` when its rollback cannot be done)
STILL_RESTARTED = {
    RolloutState.RUNNING: frozenset({MemberStep.PENDING, MemberStep.RESTARTING, MemberStep.SOAKING, MemberStep.DONE}),
    RolloutState.PAUSED: frozenset({MemberStep.PENDING, MemberStep.RESTARTING, MemberStep.SOAKING, MemberStep.DONE}),
    RolloutState.ROLLING_BACK: frozenset({MemberStep.RESTARTING, MemberStep.SOAKING, MemberStep.DONE,
                                          MemberStep.ROLLING_BACK}),
}


def _rollout_member(tx: Transaction, backend: str) -> str:
    for r in tx.active_rollouts():
        for m in tx.rollout_members(r.id):
            if m.backend == backend and m.step in STILL_RESTARTED.get(r.state, frozenset()):
                return f"rollout {r.id} ({r.state.value}; {backend} {m.step.value})"
    return ""


def _command_change(tx: Transaction, inc: Incident | None) -> str | None:
    """A restart with another command that waits to begin (open): a rollout's while its rollout runs or is
    paused, or a rollback's. Not one that began, nor one a rollout left behind (it is called off)."""
    if inc is None or inc.command is None or inc.state != IncidentState.OPEN:
        return None
    if inc.command.rollout_id is None:
        return ""
    return None if stale_rollout(tx, inc) else str(inc.command.rollout_id)


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    admin: AdminState                   # the backend's operator state afterwards
    incident_id: int | None = None      # restart: the incident that carries it


def carry_out(store: StateStore, config: Config, req: Request, now: float) -> Outcome:
    """Decide and record the command."""
    with store.tx() as tx:
        f = facts(tx, config, req)
        p = plan(req.command, f)
        who = f"{req.by or 'unknown'}: {req.reason}"
        detail = {"by": req.by, "asked_reason": req.reason, "force": req.force, "admin_before": f.admin.value,
                  "lifecycle": f.lifecycle.value}
        if p.refused is not None:
            tx.event(now, "operator_refused", req.backend, reason=f"{req.command.value} refused ({p.refused.value}): "
                     f"{p.reason}; asked by {who}", command=req.command.value, refusal=p.refused.value, **detail)
            return Outcome(p, f.admin)
        if p.request_restart:
            incident_id = tx.request_restart(req.backend, now, req.by, req.force)
            tx.event(now, "operator_restart", req.backend, incident_id, reason=f"{p.reason}; incident {incident_id}; "
                     f"asked by {who}", changed=True, forced=p.forced, **detail)
            return Outcome(p, f.admin, incident_id)
        if p.target is None:
            tx.event(now, f"operator_{req.command.value}", req.backend, reason=f"{p.reason}; nothing changed; "
                     f"asked by {who}", changed=False, **detail)
            return Outcome(p, f.admin)
        tx.set_admin(req.backend, p.target, now, req.by, req.reason)
        forced = " (forced past a rule: --force)" if p.forced else ""
        tx.event(now, f"operator_{req.command.value}", req.backend,
                 reason=f"{p.reason}{forced}; asked by {who}", changed=True, admin_after=p.target.value,
                 forced=p.forced, **detail)
        if p.target == AdminState.IN_SERVICE:
            inc = tx.active_incident(req.backend)
            if inc is not None and inc.state == IncidentState.OBSERVED and inc.last_decision == HELD:
                tx.move_incident(inc.id, now, IncidentState.OPEN, last_decision="", next_check_at=0.0)
                tx.event(now, "reopened", req.backend, inc.id, reason=f"incident {inc.id} looked at again: "
                         f"{req.backend} is back in service ({req.command.value} by {req.by})")
        if p.close_incident:
            inc = tx.active_incident(req.backend)
            if inc is not None and inc.state not in RESTART_UNDER_WAY:
                tx.move_incident(inc.id, now, IncidentState.CLOSED, close_reason="retired")
                tx.event(now, "closed", req.backend, inc.id,
                         reason=f"incident {inc.id} ({inc.state}) closed: the backend was retired by {req.by}")
        return Outcome(p, p.target)
