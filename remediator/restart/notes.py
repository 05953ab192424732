"""Bookkeeping the steps share: a decision that is not a restart, an escalation, closing an incident."""

from __future__ import annotations

from llm_health.remediator import policy
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.choices import Note, deferral_key, deferral_next_check, note_kind
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.result import DONE, StepResult, look_again
from llm_health.remediator.store import IncidentState, Transaction

S = LifecycleState


def note(ctx: Context, tx: Transaction, incident_id: int, backend: str, d: policy.Decision,
         now: float) -> StepResult:
    """Record a decision that is not a restart; repeated identical deferrals are logged once."""
    if d.opens_breaker and not tx.breaker().open:
        tx.open_breaker(now, d.reason)
        tx.event(now, "breaker_open", backend, incident_id, reason=d.reason)
    kind = note_kind(d)
    if kind == Note.CLOSE:
        tx.move_incident(incident_id, now, IncidentState.CLOSED, close_reason=d.kind, last_decision=d.kind)
        tx.event(now, d.kind, backend, incident_id, reason=d.reason + "; incident closed, no restart")
        return DONE
    if kind == Note.DRY_RUN:
        tx.add_dry_run(incident_id, backend, ctx.holder, now, ctx.clocks.mono(), ctx.clocks.boot)
        tx.move_incident(incident_id, now, IncidentState.OBSERVED, last_decision=d.kind)
        tx.event(now, d.kind, backend, incident_id, reason="dry run: " + d.reason)
        return DONE
    if kind == Note.OBSERVE:
        tx.move_incident(incident_id, now, IncidentState.OBSERVED, last_decision=d.kind)
        tx.event(now, d.kind, backend, incident_id, reason=d.reason)
        return DONE
    key = deferral_key(d)
    inc = tx.incident(incident_id)
    t = ctx.clocks.mono()
    next_check = deferral_next_check(d, now, t)
    tx.note_decision(incident_id, now, key, d.kind, next_check)
    if inc is None or inc.last_note != key:
        tx.event(now, d.kind, backend, incident_id, reason=d.reason, retry_at=d.retry_at)
    return look_again(next_check, t)


def escalate(tx: Transaction, backend: str, incident_id: int | None, now: float, reason: str) -> None:
    tx.bump("escalations", backend)
    tx.event(now, "escalated", backend, incident_id, reason=reason + "; needs a person (see the "
             "status page; acknowledge via POST /api/backends/<name>/ack)")


def close(ctx: Context, incident_id: int, backend: str, kind: str, reason: str) -> StepResult:
    """Close an incident whatever its state. A lifecycle its restart still owns (draining, stopped,
    initializing) is released to ERROR: otherwise the backend, once back in the fleet, would hold
    its host's mutex and defer its own restarts forever."""
    now = ctx.clocks.wall()
    with ctx.fenced() as tx:
        tx.move_incident(incident_id, now, IncidentState.CLOSED, close_reason=reason)
        tx.event(now, kind, backend, incident_id, reason=reason)
        r = tx.lifecycle(backend)
        if r is not None and r.incident_id == incident_id and r.state != S.ERROR:
            tx.move_lifecycle(backend, S.ERROR, now, f"incident {incident_id} closed mid-restart: {reason}")
    return DONE


HELD = "held_by_operator"       # the decision that parks an incident of a drained backend (remediator/commands.py)


def hold_off(ctx: Context, incident_id: int, backend: str, why: str) -> StepResult:
    """An OPEN incident of a backend an operator drained: no automatic restart (the operator holds it, and
    may be collecting evidence from it); OBSERVED until its alerts resolve or an operator puts the backend
    back (which re-opens it: remediator/operate.py)."""
    now = ctx.clocks.wall()
    with ctx.fenced() as tx:
        if tx.incident_in(incident_id, IncidentState.OPEN) is None:
            return DONE
        tx.move_incident(incident_id, now, IncidentState.OBSERVED, last_decision=HELD)
        tx.event(now, HELD, backend, incident_id, reason=f"{why}: no automatic restart while an operator holds it; "
                 "looked at again when it is undrained")
    return DONE
