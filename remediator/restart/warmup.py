"""Steps `warm-up` (WARMING) and `recovery` (NEEDS_ACK): is the backend back?

Warm-up follows a restart that exited 0: /health, /v1/models and a healthy verification (the warm-up
check), until `warmup_timeout` (then ERROR, escalated, needs_ack: never restarted again by itself).
Recovery is the same check for an incident whose outcome is unknown: it closes by itself once the
backend answers again, or stays for a person. Both close the incident as `recovered` the same way.
"""

from __future__ import annotations

from llm_health.config import Backend
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.choices import Warmup, moves_when_warm, warmup_after_check
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.notes import escalate
from llm_health.remediator.restart.result import DONE, LookAgain, StepResult
from llm_health.remediator.restart.silences import unsilence_fenced
from llm_health.remediator.store import Incident, IncidentState, Transaction

S = LifecycleState
IS = IncidentState
WARMUP_TIMEOUT = "warmup_timeout"   # the decision (and event) of a restart whose backend never became warm


def watch_warmup(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    deadline = float(inc.warm_deadline or 0)
    if ctx.clocks.mono() > deadline:
        return warmup_timed_out(ctx, inc.id, backend.name, "")
    ready, why = check(ctx, backend)
    if warmup_after_check(ready, ctx.clocks.mono(), deadline) == Warmup.TIMED_OUT:
        return warmup_timed_out(ctx, inc.id, backend.name, why)   # the check itself ran past the deadline
    return settle(ctx, inc.id, IS.WARMING, backend, ready, why, note=why[:200])


def watch_recovery(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    """An incident with an unknown outcome closes by itself once the backend answers again."""
    ready, why = check(ctx, backend)
    return settle(ctx, inc.id, IS.NEEDS_ACK, backend, ready, why, note=None)


def check(ctx: Context, backend: Backend) -> tuple[bool, str]:
    """The warm-up check (it may send a probe: counted)."""
    return ctx.io.warmup_check(backend)


def settle(ctx: Context, incident_id: int, state: IncidentState, backend: Backend, ready: bool, why: str,
           note: str | None) -> StepResult:
    """Write what the check found, if the incident is still in `state`: warm = recovered and closed (the
    lifecycle to READY), else look again after warmup_poll (keeping `note` when given). A backend found
    warm gets its alerts back once a lease check passed (a deposed holder expires no silence:
    the new holder's may be among them), before the incident closes."""
    if ready:
        unsilence_fenced(ctx, backend.name)
    return _record_check(ctx, incident_id, state, backend, ready, why, note)


def _record_check(ctx: Context, incident_id: int, state: IncidentState, backend: Backend, ready: bool, why: str,
                  note: str | None) -> StepResult:
    now, t = ctx.clocks.wall(), ctx.clocks.mono()
    with ctx.fenced() as tx:
        if tx.incident_in(incident_id, state) is None:
            return DONE
        if not ready:
            tx.look_again_at(incident_id, t + ctx.r.warmup_poll, note=note)
            return LookAgain(t + ctx.r.warmup_poll)
        walk(tx, backend.name, moves_when_warm(tx.lifecycle_state(backend.name), from_error=state == IS.NEEDS_ACK),
             now, why, incident_id)
        tx.move_incident(incident_id, now, IS.CLOSED, close_reason="recovered", last_decision="recovered")
        tx.event(now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
    return DONE


def walk(tx: Transaction, backend: str, moves: tuple[LifecycleState, ...], now: float, why: str,
         incident_id: int) -> None:
    """The incident's lifecycle steps in order; stops at the first the table refuses."""
    for target in moves:
        reason = f"warm: {why}" if target == S.READY else f"answers again: {why}"
        if not tx.move_lifecycle(backend, target, now, reason, incident_id):
            return


def warmup_timed_out(ctx: Context, incident_id: int, name: str, last: str) -> StepResult:
    unsilence_fenced(ctx, name)       # its alerts page people again before it is handed to them
    now = ctx.clocks.wall()
    with ctx.fenced() as tx:
        if tx.incident_in(incident_id, IS.WARMING) is None:
            return DONE
        why = f"not warm {ctx.r.warmup_timeout:g}s after the restart" + (f" (last check: {last})" if last else "")
        tx.move_lifecycle(name, S.ERROR, now, f"warm-up timeout: {why}", incident_id)
        tx.move_incident(incident_id, now, IS.NEEDS_ACK, last_decision=WARMUP_TIMEOUT)
        tx.event(now, WARMUP_TIMEOUT, name, incident_id, reason=f"{why}; needs a person, not restarted again")
        escalate(tx, name, incident_id, now, f"warm-up timeout: {why}")
    return DONE
