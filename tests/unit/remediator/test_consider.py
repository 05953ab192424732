"""Before a restart (remediator/restart/consider.py and gates.py): the verification decides (recovered,
restarted by someone else, unknown, down, dry run, no action) and the gates hold it (backoff,
budget, the fleet breaker, the per-host mutex, the min_ready floor); an unresponsive backend is restarted
once, after unresponsive_after of consecutive samples. In-process, pass by pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator import action
from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import AUTH, World, fleet, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_backend_that_recovered_is_not_restarted(w: World) -> None:
    w.outcomes["gpu-a"] = "progress"
    w.post(payload(alert()))
    w.run()
    assert w.calls == [] and w.incident() is None
    assert "verified_healthy" in w.kinds("gpu-a")


@pytest.mark.parametrize(("outcome", "in_transaction"), [("progress", False), ("restarted", False),
                                                        ("unknown", False), ("down", True)])
def test_the_facts_are_read_under_the_write_lock_only_when_a_restart_may_follow(
        w: World, monkeypatch: pytest.MonkeyPatch, outcome: str, in_transaction: bool) -> None:
    """After an outcome that cannot lead to a restart, the policy's facts (breaker, markers, restart history:
    4 round trips on PostgreSQL) are read before the transaction, not under the cluster's write lock."""
    from llm_health.remediator.restart import consider
    from llm_health.remediator.store import Transaction

    where: list[bool] = []
    real = consider.facts

    def spy(ctx, rd, *args, **kw):  # type: ignore[no-untyped-def]
        where.append(callable(getattr(rd, "move_incident", None)))     # a write transaction's view
        return real(ctx, rd, *args, **kw)

    assert callable(getattr(Transaction, "move_incident", None))
    monkeypatch.setattr(consider, "facts", spy)
    w.outcomes["gpu-a"] = outcome
    w.post(payload(alert()))
    w.run()
    # the cheap gates before the verification, then the facts of the decision: in the transaction, or before it
    assert where == [False, in_transaction] if in_transaction else where == [False, False], where


def test_facts_read_before_the_transaction_stand_in_only_when_no_gate_holds_the_incident() -> None:
    """A held incident's note may write more than a note (the breaker opened on a count an operator has just
    reset): then its gates are read again under the lock. Pure (consider.facts_before)."""
    from llm_health.config import Breaker
    from llm_health.exporter.observation import Verification, VerifyOutcome
    from llm_health.remediator import policy
    from llm_health.remediator.restart.consider import facts_before

    settings = policy.Settings(breaker=Breaker(restarts=1, window=3600.0))
    clear = policy.Facts(now=100.0, backend="gpu-a")
    healthy, down = Verification(VerifyOutcome.PROGRESS, "moving"), Verification(VerifyOutcome.DOWN, "refused")
    assert facts_before(clear, healthy, settings) is clear
    assert facts_before(clear, down, settings) is None                                # a restart may follow
    for held in (policy.Facts(now=100.0, backend="gpu-a", breaker_open=True),
                 policy.Facts(now=100.0, backend="gpu-a", fleet_restarts=(50.0,)),       # the breaker would open
                 policy.Facts(now=100.0, backend="gpu-a", has_action=False)):
        assert facts_before(held, healthy, settings) is None, held


def test_restarted_by_someone_else_is_not_restarted(w: World) -> None:
    w.outcomes["gpu-a"] = "restarted"
    w.post(payload(alert()))
    w.run()
    assert w.calls == [] and "restarted_by_other" in w.kinds("gpu-a")


def test_unknown_verification_fails_closed_then_retries(w: World) -> None:
    w.outcomes["gpu-a"] = "unknown"
    w.post(payload(alert()))
    w.run(5)
    assert w.calls == [] and w.incident().state == "open"
    assert w.kinds("gpu-a").count("deferred_unknown") == 1
    assert w.verifications == 1            # not re-verified on every tick
    w.outcomes["gpu-a"] = "no_progress"
    w.clock.advance(1)
    w.run()
    assert w.calls == [("restart-a", "--now")]


def test_verified_down_skips_the_drain(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.outcomes["gpu-a"] = "down"
    w.deliver(payload(alert()))
    w.run()
    assert w.steps()[1] == ("ready", "stopped")    # nothing to drain
    assert w.restarted == ["gpu-a"]


def test_dry_run_records_would_restart(tmp_path: Path) -> None:
    w = four_backends(tmp_path, dry_run=True)
    w.post(payload(alert()))
    w.run()
    assert w.calls == [] and "would_restart" in w.kinds("gpu-a")
    w.post(payload(alert(alertname="LLMBackendDown")))
    w.run()
    assert w.kinds("gpu-a").count("would_restart") == 1


def test_backend_without_action_is_only_recorded(w: World) -> None:
    w.post(payload(alert(backend="gpu-n")))
    w.run()
    assert w.calls == [] and "not_configured" in w.kinds("gpu-n")


def test_failed_action_waits_for_backoff(w: World) -> None:
    w.result = action.ActionResult(action.FAILED, 3, "boom")
    w.post(payload(alert()))
    w.run(5)
    assert len(w.calls) == 1 and w.incident().state == "open"
    assert "deferred_backoff" in w.kinds("gpu-a")
    w.clock.advance(99)
    w.run()
    assert len(w.calls) == 1
    w.clock.advance(2)
    w.run()
    assert len(w.calls) == 2
    restarts = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(restarts, 'llm_health_remediator_restarts_total{backend="gpu-a",result="failed"} 2')


def test_breaker_opens_across_the_fleet_and_resets_through_api(tmp_path: Path) -> None:
    w = four_backends(tmp_path, breaker={"restarts": 2, "window": 10000})
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        w.post(payload(alert(backend=name)))
    w.run(5)
    assert len(w.calls) == 2
    assert "breaker_open" in w.kinds()
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, "llm_health_remediator_breaker_open 1")
    w.clock.advance(20_000)                      # stays open after the window
    w.run()
    assert len(w.calls) == 2
    assert w.client.post("/api/breaker/reset").status_code == 401
    assert w.client.post("/api/breaker/reset", headers=AUTH).status_code == 200
    w.run()
    assert len(w.calls) == 3
    assert has_sample(w.client.get("/metrics").get_data(as_text=True), "llm_health_remediator_breaker_open 0")


def test_a_breaker_reset_landing_between_the_cheap_gates_and_their_note_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cheap gates are read outside the lock; the fleet's count at its limit says "open the breaker". An
    operator's reset committed before the note's transaction must stand (before: the note opened it again,
    and automatic restarts stopped fleet-wide until a second reset)."""
    from llm_health.remediator.restart import consider

    w = four_backends(tmp_path, breaker={"restarts": 2, "window": 10000})
    for name in ("gpu-a", "gpu-b"):
        w.post(payload(alert(backend=name)))
    w.run(5)
    assert len(w.calls) == 2 and not w.store.breaker().open
    real, landed = consider.facts, []

    def reset_lands_after_the_read(ctx, rd, backend, now, *args, **kw):  # type: ignore[no-untyped-def]
        out = real(ctx, rd, backend, now, *args, **kw)
        if backend.name == "gpu-c" and not landed and not callable(getattr(rd, "move_incident", None)):
            with w.store.tx() as tx:                 # POST /api/breaker/reset, between the read and the note
                tx.reset_breaker(now)
            landed.append(True)
        return out

    monkeypatch.setattr(consider, "facts", reset_lands_after_the_read)
    w.post(payload(alert(backend="gpu-c")))
    w.run()
    assert landed and not w.store.breaker().open and "breaker_open" not in w.kinds("gpu-c")
    w.run(5)
    assert len(w.calls) == 3                         # verified and restarted at a later look


def test_budget_holds_over_incidents(tmp_path: Path) -> None:
    w = four_backends(tmp_path, budget={"restarts": 2, "window": 10000})
    for i in range(4):
        w.post(payload(alert(starts_at=f"2026-11-30T0{i}:00:00Z")))
        w.run()
        w.ready["gpu-a"] = True
        w.clock.advance(2000)
        w.run()
        w.ready["gpu-a"] = False
    assert len(w.calls) == 2
    assert "deferred_budget" in w.kinds("gpu-a")


def test_per_host_mutex_defers_the_second_backend(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), hosts={"gpu-a": "n1", "gpu-b": "n1", "gpu-c": "n2"})
    w.deliver(payload(alert("gpu-a"), alert("gpu-b"), alert("gpu-c")))
    w.run()
    assert (w.state("gpu-a"), w.state("gpu-b"), w.state("gpu-c")) == ("draining", "ready", "draining")
    deferred = w.store.events(kind="deferred_host")
    assert [e.backend for e in deferred] == ["gpu-b"] and "gpu-a on the same host n1" in deferred[0].reason
    w.ready["gpu-a"] = w.ready["gpu-c"] = False
    w.clock.advance(5)
    w.run()
    assert w.state("gpu-a") == "initializing" and w.state("gpu-b") == "ready"    # still waiting
    w.run(5)
    assert len(w.store.events(kind="deferred_host")) == 1                      # logged once
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.state("gpu-a") == "ready" and w.state("gpu-b") == "draining"


def test_min_ready_floor_and_the_down_exception(tmp_path: Path) -> None:
    w = fleet(tmp_path, min_ready=1)
    w.deliver(payload(alert("gpu-a"), alert("gpu-b")))
    w.run()
    assert (w.state("gpu-a"), w.state("gpu-b")) == ("draining", "ready")
    assert [e.backend for e in w.store.events(kind="deferred_min_ready")] == ["gpu-b"]
    w.outcomes["gpu-b"] = "down"                   # gpu-b goes down: restarting it costs no capacity
    w.ready["gpu-b"] = False
    w.clock.advance(1)
    w.run()
    assert w.state("gpu-b") == "initializing" and ("ready", "stopped") in w.steps("gpu-b")
    assert w.restarted == ["gpu-b"]


def test_unresponsive_restarts_once_after_the_window_and_a_break_restarts_the_window(tmp_path: Path) -> None:
    w = fleet(tmp_path, unresponsive_after=120)
    w.outcomes["gpu-a"] = "unresponsive"
    w.deliver(payload(alert()))
    w.run()
    first = w.last_incident()["unresponsive_since"]
    assert first == w.clock.t and w.state() == "ready"
    w.clock.advance(60)
    w.run()
    w.outcomes["gpu-a"] = "unknown"                # one answer in between: the run is broken
    w.clock.advance(1)
    w.run()
    assert w.last_incident()["unresponsive_since"] is None
    w.outcomes["gpu-a"] = "unresponsive"
    w.clock.advance(1)
    w.run()
    assert w.last_incident()["unresponsive_since"] == w.clock.t
    for _ in range(11):                            # consecutive samples (a gap of two verifications starts over)
        w.clock.advance(10)
        w.run()
    w.clock.advance(9)
    w.run()
    assert w.restarted == [] and w.state() == "ready"
    w.clock.advance(1)
    w.run()
    assert w.state() == "draining"
    w.clock.advance(5)                             # treated like a stall: stalled_drain_timeout
    w.run()
    w.clock.advance(5)
    w.run(5)
    assert w.restarted == ["gpu-a"]
    assert len(w.store.events(kind="restarting", backend="gpu-a")) == 1
    draining = w.store.events(kind="draining", backend="gpu-a")
    assert len(draining) == 1 and "no answer to /metrics for 120 s with work in flight" in draining[0].reason
