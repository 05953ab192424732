"""A restart an operator asked for (`llm-health ctl restart`): steps `consider` and `drain` for it.

The same authority and the same procedure as an automatic restart (drain -> stop -> start -> warm-up ->
READY), under the same per-host mutex and concurrency bound, but decided by a person: no verification
(a healthy server may be restarted on purpose, e.g. for an upgrade), no backoff, and progress during
the drain is expected, so it never calls the restart off: the drain waits until the in-flight work is
done or `drain_timeout` runs out. The breaker, the budget, busy markers and the min_ready floor hold it
back (deferred, retried, audited) unless the operator forced it (policy.decide_requested).

A restart a rollout asked for carries the new command (incidents.command); it never begins once its
rollout no longer runs (`stale_rollout`, checked in the transaction that would claim it or end its drain):
the rollout rolled back or ended meanwhile, so it is called off.
"""

from __future__ import annotations

from typing import Any

from llm_health.config import Backend
from llm_health.exporter.observation import Verification, VerifyOutcome
from llm_health.remediator import policy
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.act import carry_out, claim
from llm_health.remediator.restart.choices import Drain, drain_progress
from llm_health.remediator.restart.consider import begin
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.draining import drain_lost, in_flight_now
from llm_health.remediator.restart.gates import concurrency_gate, facts, floor_gate, host_gate
from llm_health.remediator.restart.notes import note
from llm_health.remediator.restart.result import DONE, LookAgain, StepResult
from llm_health.remediator.restart.silences import silence_safely, unsilence_fenced
from llm_health.remediator.rollout.plan import CALLED_OFF
from llm_health.remediator.store import Incident, IncidentState, Reads, RolloutState, Transaction

S = LifecycleState
IS = IncidentState
#: what the drain of a requested restart starts from (no verification: the operator's word)
ASKED = Verification(VerifyOutcome.UNKNOWN, "asked for by an operator")


def decision(ctx: Context, rd: Reads, inc: Incident, backend: Backend, now: float) -> policy.Decision:
    paused = paused_rollout(rd, inc)
    if paused is not None:
        return paused
    d = policy.decide_requested(facts(ctx, rd, backend, now), ctx.settings, inc.requested_by, inc.requested_force)
    if d.kind != policy.RESTART:
        return d
    floor = None if inc.requested_force else floor_gate(ctx, rd, backend, None, now)
    return host_gate(ctx, rd, backend) or concurrency_gate(ctx, rd, inc.id) or floor or d


def stale_rollout(rd: Reads, inc: Incident) -> str:
    """Why a restart a rollout asked for (with its new command) must not begin any more ('' = it may): its
    rollout no longer runs (rolled back, aborted, ended). The rollout calls such restarts off itself; this
    holds in the claim's own transaction whatever happened in between."""
    change = inc.command
    if change is None or change.rollout_id is None:
        return ""
    r = rd.rollout(change.rollout_id)
    if r is not None and r.state in (RolloutState.RUNNING, RolloutState.PAUSED):
        return ""
    return (f"{CALLED_OFF}: rollout {change.rollout_id} is {r.state.value if r is not None else 'gone'}, its "
            "restart with the new command does not begin")


def paused_rollout(rd: Reads, inc: Incident) -> policy.Decision | None:
    """A restart a rollout asked for (with its new command) waits while its rollout is paused: "paused, no
    member starts" holds for a member whose restart was asked for and has not begun (a drain under way
    ends, the backend serves again); what already runs finishes."""
    change = inc.command
    if change is None or change.rollout_id is None:
        return None
    r = rd.rollout(change.rollout_id)
    if r is None or r.state != RolloutState.PAUSED:
        return None
    return policy.Decision(policy.DEFERRED_PAUSED, f"rollout {r.id} is paused: its restart with the new command "
                           "waits until the rollout is resumed")


def call_off(tx: Transaction, inc: Incident, backend: str, why: str, now: float, kind: str = "restart_called_off",
             **detail: Any) -> None:
    """Close a restart that has not begun (open, or draining: the drain ends, the backend is READY again).
    Alerts that fired about the backend meanwhile (absorbed into it) go on in a new incident, looked at as any
    alert is: closed with it, they were lost until Alertmanager's next repeat, hours later."""
    if inc.state == IS.DRAINING and tx.lifecycle_state(backend) == S.DRAINING:
        tx.move_lifecycle(backend, S.READY, now, f"restart {why}")
    firing = tx.firing_alerts(inc.id)
    tx.move_incident(inc.id, now, IS.CLOSED, close_reason=why)
    tx.event(now, kind, backend, inc.id, reason=f"incident {inc.id} ({inc.state.value}): {why}", **detail)
    if firing:
        carried = tx.open_incident(backend, now, inc.labels)
        tx.carry_firing_alerts(inc.id, carried)
        tx.event(now, "incident_opened", backend, carried, reason=f"{firing} alert(s) of incident {inc.id} still "
                 "firing when its restart was called off: looked at as alerts")


def called_off(ctx: Context, inc: Incident, backend: Backend, state: IncidentState) -> bool:
    """A rollout's restart whose rollout no longer runs: called off in a transaction of its own (re-checked
    there), its drain's silence ended; True: nothing more to do. Costs nothing for a restart that carries no
    rollout's command; the claim's transaction checks again (stale_rollout)."""
    if not stale_rollout(ctx.store, inc):
        return False
    with ctx.fenced() as tx:
        current = tx.incident_in(inc.id, state)
        why = stale_rollout(tx, current) if current is not None else ""
        if current is not None and why:
            call_off(tx, current, backend.name, why, ctx.clocks.wall())
    if why:
        unsilence_fenced(ctx, backend.name)        # the drain's silence: its alerts page people again
    return True


def consider_requested(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    if called_off(ctx, inc, backend, IS.OPEN):
        return DONE
    now, t = ctx.clocks.wall(), ctx.clocks.mono()
    claimed: int | None = None
    with ctx.fenced() as tx:
        current = tx.incident_in(inc.id, IS.OPEN)
        if current is None or stale_rollout(tx, current):      # its rollout moved on meanwhile: next look
            return DONE
        d = decision(ctx, tx, current, backend, now)
        if d.kind != policy.RESTART:
            return note(ctx, tx, inc.id, backend.name, d, now)
        # the same beginning as an automatic restart: a serving backend drains (drain_timeout: it is not
        # stalled), anything else is claimed at once
        claimed = begin(ctx, tx, inc.id, backend, d, ASKED, None, now, t)
        draining = claimed is None and tx.lifecycle_state(backend.name) == S.DRAINING
    if claimed is not None:
        return carry_out(ctx, inc.id, claimed, backend, with_silence=True)
    if draining:
        silence_safely(ctx, inc.id, backend)
    return DONE


def watch_requested_drain(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    if called_off(ctx, inc, backend, IS.DRAINING):
        return DONE
    seen = in_flight_now(ctx, backend)
    now, t = ctx.clocks.wall(), ctx.clocks.mono()
    claimed: int | None = None
    with ctx.fenced() as tx:
        current = tx.incident_in(inc.id, IS.DRAINING)
        r = tx.lifecycle(backend.name)
        if current is None or stale_rollout(tx, current):      # its rollout moved on meanwhile: next look
            return DONE
        if r is None or r.state != S.DRAINING:
            return drain_lost(tx, inc.id, backend, r, now)
        if drain_progress("", seen.drained, t, r.drain_deadline, now - r.since, ctx.r.drain_min) == Drain.WAIT:
            tx.look_again_at(inc.id, t + ctx.r.poll_interval)
            return LookAgain(t + ctx.r.poll_interval)
        d = paused_rollout(tx, current) or policy.decide_requested(
            facts(ctx, tx, backend, now), ctx.settings, current.requested_by, current.requested_force)
        if d.kind != policy.RESTART:              # a gate closed during the drain (a busy marker), or a pause
            tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {d.reason}")
            tx.move_incident(inc.id, now, IS.OPEN, last_note="")
            return note(ctx, tx, inc.id, backend.name, d, now)
        why = "in-flight work finished" if seen.drained else f"drain timeout, still {seen.describe()}"
        if tx.move_lifecycle(backend.name, S.STOPPED, now, why, inc.id):
            claimed = claim(ctx, tx, inc.id, backend, policy.Decision(policy.RESTART, f"{d.reason}; drained: {why}"),
                            now)
    if claimed is not None:
        return carry_out(ctx, inc.id, claimed, backend, with_silence=False)
    return DONE
