"""Step `consider` (OPEN): cheap gates -> host mutex -> concurrency -> verify -> min_ready floor -> begin.

The cheap gates are read first outside any transaction, so a deferred incident costs no verification.
The verification (about 20 s) and the in-flight read run outside any transaction; then ONE transaction
re-reads the incident (it may have been resolved or acknowledged meanwhile), records the verification,
decides again with fresh facts (read just before it when the outcome cannot lead to a restart and no gate
holds the incident) and, for a restart, re-checks the host mutex, the concurrency bound, the floor and the
lease and begins: a drain of a serving backend, or the claim at once.
"""

from __future__ import annotations

from llm_health.config import Backend
from llm_health.exporter.observation import Verification, VerifyOutcome
from llm_health.remediator import policy
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.act import carry_out, claim
from llm_health.remediator.restart.choices import Begin, drain_timeout, how_to_begin
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.draining import in_flight_now
from llm_health.remediator.restart.gates import (
    concurrency_gate,
    facts,
    floor_gate,
    host_gate,
    record_verification,
)
from llm_health.remediator.restart.notes import note
from llm_health.remediator.restart.result import DONE, StepResult
from llm_health.remediator.restart.silences import silence_safely
from llm_health.remediator.store import Incident, IncidentState, Transaction

S = LifecycleState
IS = IncidentState


def consider(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    incident_id = inc.id
    now = ctx.clocks.wall()
    d = policy.decide(facts(ctx, ctx.store, backend, now), None, ctx.settings)
    if d.kind == policy.VERIFY:
        d = host_gate(ctx, ctx.store, backend) or concurrency_gate(ctx, ctx.store, incident_id) or d
    if d.kind != policy.VERIFY:
        with ctx.fenced() as tx:
            if tx.incident_in(incident_id, IS.OPEN) is None:
                return DONE
            if d.opens_breaker:      # decided on a read outside the lock: a reset landing since must stand
                d = policy.decide(facts(ctx, tx, backend, now), None, ctx.settings)
                if d.kind == policy.VERIFY:
                    return DONE      # the gates pass now: verified at the next look
            return note(ctx, tx, incident_id, backend.name, d, now)
    verification = ctx.io.verifier(backend)
    baseline = None
    if verification.outcome in (VerifyOutcome.NO_PROGRESS, VerifyOutcome.UNRESPONSIVE):
        baseline = in_flight_now(ctx, backend)   # read outside the transaction: what the drain starts from
    now, t = ctx.clocks.wall(), ctx.clocks.mono()
    # after an outcome that cannot lead to a restart, facts that hold nothing back only choose what is noted:
    # read now, not under the cluster's write lock (4 round trips less there on PostgreSQL)
    noted_only = None
    if not policy.may_restart(verification.outcome):
        noted_only = facts_before(facts(ctx, ctx.store, backend, now), verification, ctx.settings)
    claimed: int | None = None
    with ctx.fenced() as tx:
        current = tx.incident_in(incident_id, IS.OPEN)
        if current is None:
            return DONE  # resolved or acknowledged while we verified
        since = record_verification(ctx, tx, current, verification, now, t)
        d = policy.decide(noted_only or facts(ctx, tx, backend, now, since), verification, ctx.settings)
        if d.kind == policy.RESTART:
            d = (host_gate(ctx, tx, backend) or concurrency_gate(ctx, tx, incident_id, verification)
                 or floor_gate(ctx, tx, backend, verification, now) or d)
        if d.kind != policy.RESTART:
            return note(ctx, tx, incident_id, backend.name, d, now)
        claimed = begin(ctx, tx, incident_id, backend, d, verification, baseline, now, t)
        draining = claimed is None and tx.lifecycle_state(backend.name) == S.DRAINING
    if claimed is not None:
        return carry_out(ctx, incident_id, claimed, backend, with_silence=True)
    if draining:
        silence_safely(ctx, incident_id, backend)
    return DONE


def facts_before(read: policy.Facts, verification: Verification,
                 settings: policy.Settings) -> policy.Facts | None:
    """Facts read before the transaction, when they may stand in for a read inside it: the verified outcome
    cannot lead to a restart and no gate holds the incident back. A held incident's note may write more than a
    note (a breaker opened on a count an operator has just reset), so then the gates are read again under
    the lock, as a restart's facts always are."""
    if policy.may_restart(verification.outcome) or not read.has_action:
        return None
    if policy.gates(read, settings) is not None:
        return None
    return read


def begin(ctx: Context, tx: Transaction, incident_id: int, backend: Backend, d: policy.Decision,
          verification: Verification, baseline: InFlight | None, now: float, t: float) -> int | None:
    """Drain a serving backend (returns None), or claim at once (returns the action id) when there
    is nothing to drain."""
    how = how_to_begin(tx.lifecycle_state(backend.name), verification.outcome)
    if how == Begin.DRAIN:
        timeout, stalled = drain_timeout(verification.outcome, ctx.r)
        baseline = baseline or InFlight(None, None, None, "not read")
        if not tx.move_lifecycle(backend.name, S.DRAINING, now,
                                 f"restart decided ({d.reason}); no new requests, waiting up to {timeout:g}s for "
                                 f"in-flight work ({baseline.describe()})", incident_id,
                                 drain_deadline=t + timeout, drain_baseline=baseline.reading):
            return None
        tx.move_incident(incident_id, now, IS.DRAINING, last_decision=policy.RESTART, last_note="", next_check_at=0.0)
        tx.event(now, "draining", backend.name, incident_id,
                 reason=f"{d.reason}; draining for up to {timeout:g}s "
                 f"({'stalled: it finishes nothing' if stalled else 'drain_timeout'})")
        return None
    if how == Begin.STOP_THEN_CLAIM and not tx.move_lifecycle(
            backend.name, S.STOPPED, now, f"already down, nothing to drain: {d.reason}", incident_id):
        return None
    return claim(ctx, tx, incident_id, backend, d, now)
