"""The whole pipeline for real: simulated vLLM -> exporter + Prometheus (our rules) -> Alertmanager
-> remediator -> restart through the simulator's fault API.

Every scenario starts its own stack on free loopback ports and stops every process afterwards,
also when it fails (the Stack context manager). Assertions are on the remediator's audit log and
the simulator's own /sim/stats.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.drill.procs import WaitTimeout
from llm_health.drill.stack import Stack
from tests.support.dashboard_queries import annotation_queries, dashboards_queries

pytestmark = pytest.mark.e2e


def kinds(stack: Stack, backend: str) -> list[str]:
    return [e["kind"] for e in stack.events(backend)]


def restarted(stack: Stack, backend: str) -> int:
    return kinds(stack, backend).count("restarted")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path / "stack") as s:
        yield s


def stall_with_work(stack: Stack, backend: str) -> None:
    """Put requests in flight, then wedge the engine (counters freeze, /health stays 200)."""
    load = stack.fill_slots(backend, 2)
    stack.wait(lambda: stack.sims[backend].stats()["running"] >= 2, 20, f"requests running on {backend}")
    stack.sims[backend].fault("stall")
    load.stop()


def test_stalled_backend_is_restarted_once_and_the_busy_one_is_left_alone(stack: Stack) -> None:
    batch = stack.fill_slots("sim-b", 12)
    try:
        stack.wait(lambda: stack.sims["sim-b"].stats()["running"] == 12, 20, "sim-b at 12 of 12 slots")
        stack.wait(lambda: stack.verdicts()["sim-b"]["verdict"] == "busy", 20, "sim-b judged busy")
        # from the moment the exporter has seen the work: a probe allowed by an idle reading can still
        # land within one engine step of the batch's first request (the gauges lag a step; see
        # docs/benchmarks.md, "the probe race"), so the count starts here
        baseline = stack.sims["sim-b"].stats()
        probes_before, busy_probes_before = baseline["probes"], baseline["probes_while_busy"]

        stall_with_work(stack, "sim-a")
        stack.wait(lambda: stack.verdicts()["sim-a"]["verdict"] == "stalled", 30, "sim-a judged stalled")
        stack.wait(lambda: "recovered" in kinds(stack, "sim-a"), 60, "sim-a restarted and recovered")
        stack.wait(lambda: not stack.firing("LLMBackendStalled", "sim-a"), 30, "stall alert resolved")
        stack.wait(lambda: stack.verdicts()["sim-a"]["verdict"] in ("idle", "busy"), 20, "sim-a serving")

        a, b = stack.sims["sim-a"].stats(), stack.sims["sim-b"].stats()
        assert a["restarts"] == 1, a
        assert restarted(stack, "sim-a") == 1
        # the busy backend: never restarted, never probed while it had work
        assert b["restarts"] == 0, b
        assert restarted(stack, "sim-b") == 0
        assert b["probes"] == probes_before, "a probe was sent to the saturated backend"
        assert b["probes_while_busy"] == busy_probes_before
        assert stack.sims["sim-b"].stats()["running"] == 12, "the batch kept every slot"
        assert not stack.firing("LLMBackendStalled", "sim-b")
        assert not stack.firing("LLMHealthProbeSentToBusyBackend")

        # Prometheus scrapes on its own schedule: wait until it has the new process's page too
        stack.wait(lambda: stack.query('changes(process_start_time_seconds{backend="sim-a"}[5m]) > 0'), 20,
                   "Prometheus scraped sim-a's new process")
        # every dashboard panel's query runs against this Prometheus, and every one has data in this
        # scenario, except the panels of events it does not contain (named here, with the reason)
        may_be_empty = {
            ("llm-health-remediator", "Deferrals"): "nothing is deferred in this scenario",
            ("llm-health-fleet", "Mean queue time over 15m"): "the simulator exports no queue-time histogram",
            ("llm-health-fleet", "Requests waiting with none running (admission)"):
                "no backend admits nothing in this scenario",
            ("llm-health-fleet", "Inter-token latency against its baseline"):
                "the simulator exports no inter-token histogram, and a baseline needs 30m of history",
            ("llm-health-remediator", "Rollout state"): "no rollout here (tests/e2e/test_rollout.py reads it)",
            ("llm-health-remediator", "Rollout members by step"): "no rollout here (tests/e2e/test_rollout.py)",
        }
        no_rollout = {"Rollouts", "Canary soaking"}     # annotations of a rollout: tests/e2e/test_rollout.py
        empty = []
        for dashboard, title, expr in dashboards_queries():
            if not stack.query(expr) and (dashboard, title) not in may_be_empty:  # raises on a query error
                empty.append(f"{dashboard}: {title}: {expr}")
        assert not empty, "panels without data in a scenario that feeds them:\n" + "\n".join(empty)
        # every annotation marked something during the scenario: sim-a's new process, the remediator's
        # restart, the stall alert firing (each query evaluated every second of the last 10 minutes).
        # Polled: the subquery's steps fall on whole seconds, so a sample scraped less than a second ago
        # is not under any step yet.
        annotations = [a for a in annotation_queries() if a[1] not in no_rollout]
        unmarked: list[str] = []

        def every_annotation_marked() -> bool:
            unmarked[:] = [f"{dashboard}: {name}: {expr}" for dashboard, name, expr in annotations
                           if not stack.query(f"max_over_time(({expr})[10m:1s])")]
            return not unmarked

        try:
            stack.wait(every_annotation_marked, 15, "every annotation marked the scenario")
        except WaitTimeout:
            raise AssertionError("annotations that never fired in a scenario with a restart:\n"
                                 + "\n".join(unmarked)) from None
    finally:
        batch.stop()


def test_busy_marker_defers_the_restart_until_it_is_gone(stack: Stack) -> None:
    marker = stack.set_busy("sim-a", owner="nightly-batch", ttl=300)
    stall_with_work(stack, "sim-a")
    stack.wait(lambda: "deferred_marker" in kinds(stack, "sim-a"), 60, "restart deferred by the marker")
    deferral = next(e for e in stack.events("sim-a") if e["kind"] == "deferred_marker")
    assert "nightly-batch" in (deferral.get("reason") or "")
    assert stack.sims["sim-a"].stats()["restarts"] == 0
    assert restarted(stack, "sim-a") == 0

    stack.clear_busy(marker["id"])
    stack.wait(lambda: restarted(stack, "sim-a") == 1, 60, "restart once the marker is gone")
    stack.wait(lambda: "recovered" in kinds(stack, "sim-a"), 60, "sim-a recovered")
    assert stack.sims["sim-a"].stats()["restarts"] == 1


def test_crashed_backend_is_down_restarted_once_and_back_to_idle(stack: Stack) -> None:
    stack.sims["sim-a"].fault("crash")
    stack.wait(lambda: stack.verdicts()["sim-a"]["verdict"] == "down", 30, "sim-a judged down")
    stack.wait(lambda: "recovered" in kinds(stack, "sim-a"), 60, "sim-a restarted and recovered")
    stack.wait(lambda: stack.verdicts()["sim-a"]["verdict"] == "idle", 30, "sim-a idle again")
    assert restarted(stack, "sim-a") == 1
    assert stack.sims["sim-a"].stats()["restarts"] == 1
    assert restarted(stack, "sim-b") == 0


def test_two_clustered_alertmanagers_deliver_duplicates_and_still_one_restart(tmp_path: Path) -> None:
    with Stack(tmp_path / "stack", alertmanager_replicas=2, peer_timeout="0s") as stack:
        stall_with_work(stack, "sim-a")
        stack.wait(lambda: "recovered" in kinds(stack, "sim-a"), 90, "sim-a restarted and recovered")
        deliveries = [e for e in stack.events() if e["kind"] in ("received", "deduplicated")]
        senders = {e["detail"].get("sender") for e in deliveries}
        assert senders == {stack.alertmanager_url(0), stack.alertmanager_url(1)}, (
            f"both replicas should have delivered (peer timeout 0s): {senders}")
        assert any(e["kind"] == "deduplicated" for e in deliveries)
        assert restarted(stack, "sim-a") == 1
        assert stack.sims["sim-a"].stats()["restarts"] == 1


def test_hung_backend_with_work_is_restarted_once_after_the_unresponsive_window(stack: Stack) -> None:
    """The event loop hangs (connections accepted, nothing answered): not down at once, not ignored
    forever either; restarted once it has been unresponsive for the stall window."""
    load = stack.fill_slots("sim-a", 2)
    stack.wait(lambda: stack.sims["sim-a"].stats()["running"] >= 2, 20, "requests running on sim-a")
    # the exporter must have seen the work: a hang after an idle reading is (rightly) judged down instead
    stack.wait(lambda: stack.verdicts()["sim-a"]["verdict"] == "busy", 20, "sim-a judged busy")
    stack.sims["sim-a"].fault("hang")
    load.stop()
    stack.wait(lambda: stack.verdicts()["sim-a"]["verdict"] == "stalled", 30, "hung sim-a judged stalled")
    stack.wait(lambda: "recovered" in kinds(stack, "sim-a"), 90, "sim-a restarted and recovered")
    events = stack.events("sim-a")
    assert restarted(stack, "sim-a") == 1
    assert stack.sims["sim-a"].stats()["restarts"] == 1
    decided = [e for e in events if e["kind"] in ("draining", "restarting")]
    assert decided and all("no answer" in e["reason"] for e in decided), decided
    first_unresponsive = min(e["at"] for e in events if e["kind"] == "deferred_unknown"
                             and "unresponsive" in e["reason"])
    assert min(e["at"] for e in decided) - first_unresponsive >= stack.timings.stall_after
    assert restarted(stack, "sim-b") == 0
