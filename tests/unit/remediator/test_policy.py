"""The pure restart policy with a fake clock: backoff, budget, breaker, markers, verification, and
`unresponsive` only once it persisted for unresponsive_after."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llm_health.config import Backoff, Breaker, Budget
from llm_health.exporter.observation import Verification, VerifyOutcome
from llm_health.remediator import policy
from llm_health.remediator.policy import (
    Decision,
    Facts,
    Marker,
    Settings,
    backoff_delay,
    decide,
    next_allowed,
)

S = Settings(
    backoff=Backoff(initial=100.0, factor=2.0, cap=350.0, stable_after=1000.0),
    budget=Budget(restarts=3, window=2000.0),
    breaker=Breaker(restarts=4, window=500.0),
    unknown_retry=7.0,
)


@dataclass(frozen=True)
class V:
    outcome: str
    reason: str = "test"


def facts(now: float, **kw: object) -> Facts:
    return Facts(now=now, backend="a", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        ("progress", policy.VERIFIED_HEALTHY),
        ("idle_ok", policy.VERIFIED_HEALTHY),
        ("restarted", policy.RESTARTED_BY_OTHER),
        ("no_progress", policy.RESTART),
        ("down", policy.RESTART),
        ("unknown", policy.DEFERRED_UNKNOWN),
        ("something-new", policy.DEFERRED_UNKNOWN),
    ],
)
def test_verification_outcome_decides(outcome: str, kind: str) -> None:
    assert decide(facts(50.0), None, S).kind == policy.VERIFY
    d = decide(facts(50.0), V(outcome), S)
    assert d.kind == kind
    if kind == policy.DEFERRED_UNKNOWN:
        assert d.retry_at == 57.0


def test_dry_run_would_restart_and_missing_action() -> None:
    assert decide(facts(0.0, dry_run=True), V("down"), S).kind == policy.WOULD_RESTART
    assert decide(facts(0.0, has_action=False), V("down"), S).kind == policy.NOT_CONFIGURED


def test_backoff_grows_caps_and_relaxes() -> None:
    b = S.backoff
    assert backoff_delay((), b) == 0
    assert backoff_delay((0.0,), b) == 100
    assert backoff_delay((0.0, 150.0), b) == 200
    assert backoff_delay((0.0, 150.0, 400.0), b) == 350          # 400 capped at 350
    assert backoff_delay((0.0, 1500.0), b) == 100                # gap >= stable_after starts a new streak
    assert next_allowed((0.0, 150.0), 200.0, b) == 350.0
    assert next_allowed((0.0, 150.0), 360.0, b) is None
    assert next_allowed((0.0, 150.0), 150.0 + 1000.0, b) is None  # stable: relaxed


def test_backoff_defers_with_retry_time() -> None:
    d = decide(facts(150.0, restarts=(100.0,)), None, S)
    assert d.kind == policy.DEFERRED_BACKOFF and d.retry_at == 200.0
    assert decide(facts(200.0, restarts=(100.0,)), None, S).kind == policy.VERIFY


def test_sequence_of_incidents_backoff_then_budget() -> None:
    """Drive a stalled backend through many incidents; record when restarts are allowed."""
    restarts: list[float] = []
    now = 0.0
    kinds: list[str] = []
    while now < 3000.0:
        d = decide(facts(now, restarts=tuple(restarts)), V("no_progress"), S)
        kinds.append(d.kind)
        if d.kind == policy.RESTART:
            restarts.append(now)
        now += 10.0
    # backoff 100, then 200, then budget (3 in 2000 s) until the first leaves the window at 2000
    assert restarts[:3] == [0.0, 100.0, 300.0]
    assert restarts[3] == 2000.0
    assert policy.DEFERRED_BUDGET in kinds and policy.DEFERRED_BACKOFF in kinds
    budget = decide(facts(1000.0, restarts=(0.0, 100.0, 300.0)), None, S)
    assert budget.kind == policy.DEFERRED_BUDGET and budget.retry_at == 2000.0


def test_fleet_breaker_opens_and_stays_open() -> None:
    fleet = (10.0, 20.0, 30.0, 40.0)
    d = decide(facts(50.0, fleet_restarts=fleet), V("down"), S)
    assert d.kind == policy.DEFERRED_BREAKER and d.opens_breaker
    # once open (persisted by the authority) it holds even after the window has passed
    d = decide(facts(5000.0, fleet_restarts=fleet, breaker_open=True), V("down"), S)
    assert d.kind == policy.DEFERRED_BREAKER and not d.opens_breaker
    # after a reset the store only passes restarts since the reset: allowed again
    assert decide(facts(5000.0, fleet_restarts=()), V("down"), S).kind == policy.RESTART
    # three in the window is below the limit
    assert decide(facts(50.0, fleet_restarts=fleet[:3]), V("down"), S).kind == policy.RESTART


def test_markers_defer_until_they_expire() -> None:
    m = Marker(id="m1", backend="a", owner="batch-42", expires_at=100.0)
    d = decide(facts(50.0, markers=(m,)), V("down"), S)
    assert d.kind == policy.DEFERRED_MARKER
    assert "batch-42" in d.reason and d.retry_at == 100.0
    assert decide(facts(100.0, markers=(m,)), V("down"), S).kind == policy.RESTART  # expired: ignored


def test_gates_come_before_verification() -> None:
    """A blocked restart never costs a verification (and its probe)."""
    m = Marker(id="m1", backend="a", owner="x", expires_at=100.0)
    for f in (facts(0.0, breaker_open=True), facts(0.0, markers=(m,)), facts(50.0, restarts=(0.0,))):
        d = decide(f, None, S)
        assert isinstance(d, Decision) and d.deferred and d.kind != policy.VERIFY


def test_policy_unresponsive_is_unknown_until_it_persisted() -> None:
    s = policy.Settings(unknown_retry=5, unresponsive_after=120)
    v = Verification("unresponsive", "every reading timed out")
    first = policy.decide(policy.Facts(now=1000.0, backend="a", unresponsive_since=None), v, s)
    assert first.kind == policy.DEFERRED_UNKNOWN and first.retry_at == 1005.0
    held = policy.decide(policy.Facts(now=1119.0, backend="a", unresponsive_since=1000.0), v, s)
    assert held.kind == policy.DEFERRED_UNKNOWN and held.retry_at == 1120.0
    due = policy.decide(policy.Facts(now=1120.0, backend="a", unresponsive_since=1000.0), v, s)
    assert due.kind == policy.RESTART
    assert due.reason.startswith("verified unresponsive: no answer to /metrics for 120 s with work in flight")
    dry = policy.decide(policy.Facts(now=1200.0, backend="a", unresponsive_since=1000.0, dry_run=True), v, s)
    assert dry.kind == policy.WOULD_RESTART
    assert policy.decide(policy.Facts(now=1000.0, backend="a"), Verification("unknown", ""), s).kind == \
        policy.DEFERRED_UNKNOWN
    with pytest.raises(ValueError):     # an outcome outside VerifyOutcome never reaches the policy
        Verification("weird", "")


@pytest.mark.parametrize("outcome", list(VerifyOutcome))
def test_only_an_outcome_that_may_restart_ever_decides_a_restart(outcome: VerifyOutcome) -> None:
    """restart/consider.py reads the facts of an outcome that cannot restart before its transaction, outside
    the write lock: whatever the facts (gates open or closed, dry run, unresponsive for long), decide() never
    answers a restart for it."""
    variants = [facts(5000.0), facts(5000.0, dry_run=True), facts(5000.0, unresponsive_since=0.0),
                facts(5000.0, dry_run=True, unresponsive_since=0.0)]
    kinds = {decide(f, V(outcome), S).kind for f in variants}
    assert bool(kinds & {policy.RESTART, policy.WOULD_RESTART}) == policy.may_restart(outcome), kinds
