"""Step `drain` (DRAINING): wait for in-flight work, call the restart off on progress, or claim.

Each look reads the backend's in-flight work (outside any transaction) and compares it with the reading
the drain began with (choices.drain_progress). When the drain ends without progress and the restart can
no longer rest on the pre-drain verification alone (its alerts resolved, or the drain had no starting
reading), the backend is verified again first (principle 6). One transaction then re-reads the incident
and the lifecycle, checks the gates again (a marker may have appeared) and writes the outcome.
"""

from __future__ import annotations

from llm_health.config import Backend
from llm_health.exporter.observation import Verification
from llm_health.remediator import inflight, policy
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.act import carry_out, claim
from llm_health.remediator.restart.choices import (
    Drain,
    DrainEnd,
    Recheck,
    after_recheck,
    drain_end,
    drain_progress,
)
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.gates import facts, record_verification
from llm_health.remediator.restart.notes import note
from llm_health.remediator.restart.result import DONE, LookAgain, StepResult
from llm_health.remediator.restart.silences import unsilence_safely
from llm_health.remediator.store import Incident, IncidentState, LifecycleRow, Reads, Transaction

S = LifecycleState
IS = IncidentState


def watch_drain(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    incident_id = inc.id
    seen = in_flight_now(ctx, backend)
    verification = None
    if drain_ends(ctx, backend, seen) and needs_recheck(ctx.store, incident_id, backend):
        # the alerts resolved meanwhile, or the drain has no starting reading to tell progress from:
        # the pre-drain verification alone is not enough to act on (principle 6)
        verification = ctx.io.verifier(backend)
    now, t = ctx.clocks.wall(), ctx.clocks.mono()
    claimed: int | None = None
    unsilence = False
    result: StepResult = DONE
    with ctx.fenced() as tx:
        current = tx.incident_in(incident_id, IS.DRAINING)
        r = tx.lifecycle(backend.name)
        if current is None:
            return DONE
        if r is None or r.state != S.DRAINING:
            return drain_lost(tx, incident_id, backend, r, now)
        moved = inflight.moved(r.drain_baseline, seen.reading)
        progress = drain_progress(moved, seen.drained, t, r.drain_deadline, now - r.since, ctx.r.drain_min)
        if progress == Drain.WAIT:
            tx.look_again_at(incident_id, t + ctx.r.poll_interval)
            return LookAgain(t + ctx.r.poll_interval)
        if progress == Drain.CALL_OFF:
            unsilence = True
            tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {moved}")
            tx.move_incident(incident_id, now, IS.CLOSED, close_reason=policy.VERIFIED_HEALTHY,
                             last_decision="restart_called_off")
            tx.event(now, "restart_called_off", backend.name, incident_id,
                     reason=f"{moved} ({seen.describe()}): not stalled, no restart; incident closed")
        else:
            blocked = policy.gates(facts(ctx, tx, backend, now), ctx.settings)
            why = "in-flight work finished" if seen.drained else f"drain timeout, still {seen.describe()}"
            end = drain_end(blocked is not None, verification is not None,
                            verification is None and needs_recheck(tx, incident_id, backend))
            if end == DrainEnd.CALL_OFF and blocked is not None:      # a gate closed during the drain
                unsilence = True
                tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {blocked.reason}")
                tx.move_incident(incident_id, now, IS.OPEN, last_note="")
                result = note(ctx, tx, incident_id, backend.name, blocked, now)
            elif end == DrainEnd.RECHECK:
                # changed since we looked (e.g. the alert resolved just now): re-verify next poll
                tx.look_again_at(incident_id, t)
            elif end == DrainEnd.DECIDE and verification is not None:
                claimed, unsilence, result = after_reverification(ctx, tx, current, backend, verification, why,
                                                                  now, t)
            elif end == DrainEnd.CLAIM:
                if tx.move_lifecycle(backend.name, S.STOPPED, now, why, incident_id):
                    d = policy.Decision(policy.RESTART, f"verified before the drain; drained: {why}")
                    claimed = claim(ctx, tx, incident_id, backend, d, now)
    if unsilence:
        unsilence_safely(ctx, backend.name)
    if claimed is not None:
        return carry_out(ctx, incident_id, claimed, backend, with_silence=False)
    return result


def drain_lost(tx: Transaction, incident_id: int, backend: Backend, r: LifecycleRow | None,
               now: float) -> StepResult:
    """Not ours to drain any more (refused or changed by hand): stop, say so, retry from scratch."""
    tx.move_incident(incident_id, now, IS.OPEN, last_decision="drain_lost", last_note="")
    tx.event(now, "lifecycle_refused", backend.name, incident_id,
             reason=f"incident {incident_id} is draining but the lifecycle is {r.state if r else 'missing'}; back "
             "to open")
    return DONE


def in_flight_now(ctx: Context, backend: Backend) -> InFlight:
    try:
        return ctx.io.in_flight(backend)
    except Exception as exc:  # noqa: BLE001 - an unreadable backend is "unknown", never "drained"
        return InFlight(None, None, None, f"reading failed: {exc!r}")


def drain_ends(ctx: Context, backend: Backend, seen: InFlight) -> bool:
    """Read-only: would this look at the drain end it without progress (drained, or deadline)?"""
    r = ctx.store.lifecycle(backend.name)
    if r is None or r.state != S.DRAINING:
        return False
    moved = inflight.moved(r.drain_baseline, seen.reading)
    return drain_progress(moved, seen.drained, ctx.clocks.mono(), r.drain_deadline, ctx.clocks.wall() - r.since,
                          ctx.r.drain_min) == Drain.ENDED


def needs_recheck(rd: Reads, incident_id: int, backend: Backend) -> bool:
    """Re-verify before claiming: no alert of the incident fires any more, or the drain's starting
    reading failed (so progress during the drain could not be seen)."""
    r = rd.lifecycle(backend.name)
    return not rd.firing_alerts(incident_id) or r is None or r.drain_baseline is None


def after_reverification(ctx: Context, tx: Transaction, inc: Incident, backend: Backend,
                         verification: Verification, why: str, now: float,
                         t: float) -> tuple[int | None, bool, StepResult]:
    """The drain is over and the backend was verified again: restart, or call it off. Returns
    (claimed action id, whether to remove the silence, when to look again)."""
    incident_id = inc.id
    since = record_verification(ctx, tx, inc, verification, now, t)
    d = policy.decide(facts(ctx, tx, backend, now, since), verification, ctx.settings)
    firing = tx.firing_alerts(incident_id)
    meaning = after_recheck(d, firing)
    if meaning == Recheck.RESTART:
        if not tx.move_lifecycle(backend.name, S.STOPPED, now, why, incident_id):
            return None, False, DONE
        d = policy.Decision(policy.RESTART, f"re-verified at the end of the drain ({why}): {d.reason}")
        return claim(ctx, tx, incident_id, backend, d, now), False, DONE
    tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {d.reason}")
    if meaning == Recheck.CLOSE:
        tx.move_incident(incident_id, now, IS.CLOSED, close_reason=d.kind, last_decision=d.kind)
        tx.event(now, d.kind, backend.name, incident_id,
                 reason=f"re-verified at the end of the drain{'' if firing else ' (alerts resolved)'}: "
                 f"{d.reason}; incident closed, no restart")
    elif meaning == Recheck.RESOLVED:
        tx.move_incident(incident_id, now, IS.CLOSED, close_reason="resolved", last_decision=d.kind)
        tx.event(now, "resolved", backend.name, incident_id,
                 reason=f"alerts resolved during the drain and the re-verification cannot confirm the "
                 f"restart ({d.reason}); incident closed, no restart")
    else:
        tx.move_incident(incident_id, now, IS.OPEN, last_note="")
        return None, True, note(ctx, tx, incident_id, backend.name, d, now)
    return None, True, DONE
