"""What the fleet says about one restart: policy facts, the per-host mutex, the concurrency bound and the
min_ready floor, each read from the store view it is given (a transaction when it decides a claim)."""

from __future__ import annotations

from llm_health.config import Backend
from llm_health.exporter.observation import Verification, VerifyOutcome
from llm_health.remediator import lifecycle, policy
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.marker import file_markers
from llm_health.remediator.restart.choices import unresponsive_run
from llm_health.remediator.restart.context import Context
from llm_health.remediator.sequence import has_restart
from llm_health.remediator.store import Incident, Reads, Transaction

S = LifecycleState


def facts(ctx: Context, rd: Reads, backend: Backend, now: float,
          unresponsive_since: float | None = None) -> policy.Facts:
    """Everything policy.decide needs, read in `rd` (wall time; `unresponsive_since` already wall)."""
    br = rd.breaker()
    dry = ctx.r.dry_run
    markers = rd.markers(backend.name)
    busy_dir = ctx.busy_dir
    if busy_dir is not None:
        markers += file_markers(busy_dir, backend.name, ctx.r.busy_file_ttl, ctx.r.marker_max_ttl, now=now)
    clock = {"now": now, "mono": ctx.clocks.mono() - (ctx.clocks.wall() - now), "boot": ctx.clocks.boot}
    # a rollout's planned restarts (remediator/rollout/) are no evidence of trouble: the budget, the backoff
    # and the breaker count only the others (an open breaker still holds a rollout back)
    return policy.Facts(
        now=now, backend=backend.name,
        restarts=rd.restart_times(backend.name, include_dry_run=dry, planned=False, **clock),
        fleet_restarts=rd.restart_times(None, include_dry_run=dry, after_action=br.reset_after_action, planned=False,
                                        **clock),
        breaker_open=br.open, markers=markers, has_action=has_restart(backend), dry_run=dry,
        unresponsive_since=unresponsive_since,
    )


def record_verification(ctx: Context, tx: Transaction, inc: Incident, verification: Verification, now: float,
                        t: float) -> float | None:
    """Keep the latest verification on the incident (the agent answers from it) and the start of an
    unbroken run of `unresponsive` (monotonic; choices.unresponsive_run). Returns that start as wall time
    for policy, or None."""
    since, seen = unresponsive_run(verification.outcome, inc.unresponsive_since, inc.unresponsive_seen_at, t,
                                   ctx.sample_gap())
    tx.record_verification(inc.id, verification.outcome, now, since, seen)
    return None if since is None else now - (t - since)


def gate_states(ctx: Context, rd: Reads) -> dict[str, LifecycleState]:
    """lifecycle.gate_states, without the backends an operator holds (drained, retired) unless a restart
    of ours holds them: they serve nothing, so they never count toward min_ready, and hold no mutex."""
    return lifecycle.gate_states(rd.lifecycles(), [b.name for b in ctx.config.backends], rd.admins())


def host_gate(ctx: Context, rd: Reads, backend: Backend) -> policy.Decision | None:
    ok, why = lifecycle.may_start(backend.name, backend.host, gate_states(ctx, rd),
                                  {b.name: b.host for b in ctx.config.backends})
    return None if ok else policy.Decision(policy.DEFERRED_HOST, f"per-host mutex: {why}; waiting until it is "
                                           "READY or ERROR")


def concurrency_gate(ctx: Context, rd: Reads, incident_id: int,
                     verification: Verification | None = None) -> policy.Decision | None:
    """At most max_concurrent_restarts restarts take capacity at once (Reads.restarts_in_progress). A
    backend verified down serves nothing: its restart takes no slot and waits for none."""
    if verification is not None and verification.outcome == VerifyOutcome.DOWN:
        return None
    r = ctx.r
    limit = max(1, r.max_concurrent_restarts)
    warming_until = ctx.clocks.mono() + r.warmup_timeout - r.restart_slot_warmup
    busy = rd.restarts_in_progress(except_incident=incident_id, warming_until=warming_until)
    if busy < limit:
        return None
    return policy.Decision(policy.DEFERRED_CONCURRENCY, f"{busy} restarts already in progress "
                           f"(remediator.max_concurrent_restarts {limit}); waiting for one to finish")


def floor_gate(ctx: Context, rd: Reads, backend: Backend, verification: Verification | None,
               now: float) -> policy.Decision | None:
    ok, why = lifecycle.may_drain(backend.name, gate_states(ctx, rd), ctx.r.min_ready,
                                  serves_nothing(rd, backend, verification))
    if ok:
        return None
    return policy.Decision(policy.DEFERRED_MIN_READY, f"fleet floor: {why}; a stalled backend still counts as up, "
                           "so it waits", retry_at=now + ctx.settings.unknown_retry)


def serves_nothing(rd: Reads, backend: Backend, verification: Verification | None) -> bool:
    """Down (verified), not READY in our lifecycle, or held out by an operator (drained, retired): taking it
    out lowers no capacity."""
    if verification is not None and verification.outcome == VerifyOutcome.DOWN:
        return True
    return rd.lifecycle_state(backend.name) != S.READY or rd.admin(backend.name) is not None
