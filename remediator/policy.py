"""The pure restart decision: backoff, budget, breaker, busy markers, verification -> `Decision`.

No I/O and no clock of its own: every input, including `now`, is in `Facts`. The authority calls
`decide(facts, None)` first (cheap gates; answers VERIFY when they all pass), verifies the backend,
then calls `decide(fresh_facts, verification)` and acts on the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_health.config import Backoff, Breaker, Budget
from llm_health.exporter.observation import Verification, VerifyOutcome

# decision kinds (also the audit event kinds and the `decision` label of the metrics)
DEFERRED_BREAKER = "deferred_breaker"
DEFERRED_BUDGET = "deferred_budget"
DEFERRED_BACKOFF = "deferred_backoff"
DEFERRED_MARKER = "deferred_marker"
DEFERRED_UNKNOWN = "deferred_unknown"
VERIFY = "verify"
VERIFIED_HEALTHY = "verified_healthy"
VERIFIED_ASLEEP = "verified_asleep"    # the engine sleeps on purpose (vLLM sleep mode): never a restart
RESTARTED_BY_OTHER = "restarted_by_other"
RESTART = "restart"
WOULD_RESTART = "would_restart"
NOT_CONFIGURED = "not_configured"
# decided from the fleet, beside these (remediator/restart/gates.py)
DEFERRED_HOST = "deferred_host"                  # the per-host mutex: another backend on the host restarts
DEFERRED_MIN_READY = "deferred_min_ready"        # the min_ready floor
DEFERRED_CONCURRENCY = "deferred_concurrency"    # max_concurrent_restarts restarts already take capacity
DEFERRED_PAUSED = "deferred_paused"              # a rollout's restart (its new command): the rollout is paused

HEALTHY_OUTCOMES = (VerifyOutcome.PROGRESS, VerifyOutcome.IDLE_OK)
RESTART_OUTCOMES = (VerifyOutcome.NO_PROGRESS, VerifyOutcome.DOWN)
#: decisions that close the incident without a restart
NO_RESTART_CLOSES = (VERIFIED_HEALTHY, VERIFIED_ASLEEP, RESTARTED_BY_OTHER)
#: verified outcomes that may take a server out of the load balancer (remediator/agent.py)
OUT_OF_SERVICE_OUTCOMES = (*RESTART_OUTCOMES, VerifyOutcome.UNRESPONSIVE)


def may_restart(outcome: VerifyOutcome) -> bool:
    """Whether decide() can answer RESTART (or WOULD_RESTART) after this verified outcome, whatever the facts
    (restart/consider.py reads the facts of any other outcome before its transaction, not under the lock)."""
    return outcome in OUT_OF_SERVICE_OUTCOMES


@dataclass(frozen=True)
class Marker:
    id: str
    backend: str
    owner: str
    expires_at: float

    def valid(self, now: float) -> bool:
        return self.expires_at > now


@dataclass(frozen=True)
class Facts:
    now: float
    backend: str
    restarts: tuple[float, ...] = ()          # start times of this backend's restart attempts
    fleet_restarts: tuple[float, ...] = ()    # all backends' attempts since the last breaker reset
    breaker_open: bool = False
    markers: tuple[Marker, ...] = ()
    has_action: bool = True                   # a restart argv is configured
    dry_run: bool = False
    unresponsive_since: float | None = None   # first of the incident's unbroken run of `unresponsive`


@dataclass(frozen=True)
class Settings:
    backoff: Backoff = field(default_factory=Backoff)
    budget: Budget = field(default_factory=Budget)
    breaker: Breaker = field(default_factory=Breaker)
    unknown_retry: float = 5.0                # re-verify this long after an "unknown" verification
    unresponsive_after: float = 120.0         # `unresponsive` this long (one incident) = restart-worthy


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str
    retry_at: float | None = None             # when to look again (deferrals)
    opens_breaker: bool = False

    @property
    def deferred(self) -> bool:
        return self.kind.startswith("deferred_")


def backoff_delay(restarts: tuple[float, ...], backoff: Backoff) -> float:
    """Delay after the last restart: initial * factor^(n-1), capped, n = restarts in the current streak
    (a gap of `stable_after` or more between two restarts starts a new streak)."""
    if not restarts:
        return 0.0
    ordered = sorted(restarts)
    streak = 1
    for prev, cur in zip(ordered, ordered[1:], strict=False):
        streak = 1 if cur - prev >= backoff.stable_after else streak + 1
    return min(backoff.cap, backoff.initial * backoff.factor ** (streak - 1))


def next_allowed(restarts: tuple[float, ...], now: float, backoff: Backoff) -> float | None:
    """The earliest time another restart is allowed, or None when nothing holds it back."""
    if not restarts:
        return None
    last = max(restarts)
    if now - last >= backoff.stable_after:
        return None
    at = last + backoff_delay(restarts, backoff)
    return at if at > now else None


def _in_window(times: tuple[float, ...], now: float, window: float) -> list[float]:
    return sorted(t for t in times if now - t < window)


def gates(facts: Facts, s: Settings, backoff: bool = True) -> Decision | None:
    """The cheap checks, in order; None when none of them holds the restart back. `backoff=False`: a
    person asked for this restart, the backoff (meant for automatic ones) does not apply."""
    now = facts.now
    if facts.breaker_open:
        return Decision(DEFERRED_BREAKER, "fleet circuit breaker is open (reset via POST /api/breaker/reset)")
    recent = _in_window(facts.restarts, now, s.budget.window)
    if len(recent) >= s.budget.restarts:
        retry = recent[0] + s.budget.window if recent else None
        return Decision(
            DEFERRED_BUDGET,
            f"restart budget used: {len(recent)} of {s.budget.restarts} in {s.budget.window:g}s",
            retry_at=retry,
        )
    allowed = next_allowed(facts.restarts, now, s.backoff) if backoff else None
    if allowed is not None:
        return Decision(DEFERRED_BACKOFF, f"backoff: next restart allowed in {allowed - now:.1f}s", retry_at=allowed)
    fleet = _in_window(facts.fleet_restarts, now, s.breaker.window)
    if len(fleet) >= s.breaker.restarts:
        return Decision(
            DEFERRED_BREAKER,
            f"fleet circuit breaker opened: {len(fleet)} restarts across the fleet in {s.breaker.window:g}s "
            f"(limit {s.breaker.restarts})",
            opens_breaker=True,
        )
    valid = sorted((m for m in facts.markers if m.valid(now)), key=lambda m: m.expires_at)
    if valid:
        m = valid[-1]
        return Decision(
            DEFERRED_MARKER,
            f"busy marker {m.id} by {m.owner!r} until {m.expires_at:.0f} ({m.expires_at - now:.0f}s left)",
            retry_at=valid[0].expires_at,
        )
    return None


def decide(facts: Facts, verification: Verification | None, s: Settings) -> Decision:
    """`verification`: the backend's fresh verification (exporter.check.verify), None before one."""
    if not facts.has_action:
        return Decision(NOT_CONFIGURED, "no restart action configured for this backend")
    blocked = gates(facts, s)
    if blocked is not None:
        return blocked
    if verification is None:
        return Decision(VERIFY, "gates passed; verify with fresh direct readings")
    outcome, why = verification.outcome, verification.reason
    if outcome in HEALTHY_OUTCOMES:
        return Decision(VERIFIED_HEALTHY, f"verified healthy ({outcome}): {why}")
    if outcome == VerifyOutcome.SLEEPING:
        return Decision(VERIFIED_ASLEEP, f"asleep on purpose, a wake-up is not a restart: {why}")
    if outcome == VerifyOutcome.RESTARTED:
        return Decision(RESTARTED_BY_OTHER, f"another process answers now (restarted by someone else): {why}")
    if outcome in RESTART_OUTCOMES:
        kind = WOULD_RESTART if facts.dry_run else RESTART
        return Decision(kind, f"verified {outcome}: {why}")
    if outcome == VerifyOutcome.UNRESPONSIVE:
        return _unresponsive(facts, why, s)
    return Decision(
        DEFERRED_UNKNOWN,
        f"verification {outcome}: cannot tell, not acting (fail closed): {why}",
        retry_at=facts.now + s.unknown_retry,
    )


def decide_requested(facts: Facts, s: Settings, by: str, force: bool = False) -> Decision:
    """A restart an operator asked for (`llm-health ctl restart`): no verification (the operator says why),
    no backoff (a person decided); the breaker, the budget and busy markers still hold it back unless
    forced, and a dry run still only says what it would do."""
    if not facts.has_action:
        return Decision(NOT_CONFIGURED, "no restart action configured for this backend")
    blocked = None if force else gates(facts, s, backoff=False)
    if blocked is not None:
        return blocked
    kind = WOULD_RESTART if facts.dry_run else RESTART
    forced = " (forced past the breaker, budget and busy markers)" if force else ""
    return Decision(kind, f"requested by {by}{forced}")


def _unresponsive(facts: Facts, why: str, s: Settings) -> Decision:
    """A hung server (connections accepted, no answer): unknown - defer, fail closed - until the incident
    has seen nothing but `unresponsive` for `unresponsive_after` seconds; then it is restart-worthy."""
    since = facts.unresponsive_since
    held = 0.0 if since is None else max(0.0, facts.now - since)
    if since is not None and held >= s.unresponsive_after:
        kind = WOULD_RESTART if facts.dry_run else RESTART
        return Decision(kind, f"verified unresponsive: no answer to /metrics for {held:.0f} s with work in flight "
                        f"({why})")
    due = (since if since is not None else facts.now) + s.unresponsive_after
    return Decision(
        DEFERRED_UNKNOWN,
        f"verification unresponsive for {held:.0f} s of {s.unresponsive_after:g} s: not acting yet (fail "
        f"closed): {why}",
        retry_at=max(facts.now, min(facts.now + s.unknown_retry, due)),
    )
