"""A rollout driven pass by pass through the real Authority (tests.support.remediator.World, fake clock),
its gate scripted: the order, one member per host at a time, the floor, the canary's soak, rollback with the
previous command, pause/resume/abort, and the rollback's corner cases (a restart not begun is called off, a
failed one is never retried, a canary that never warms up). A crash of the remediator mid-rollout:
tests/e2e/test_rollout.py (kill -9)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from llm_health.exporter.verdict import Verdict
from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import agent_reply
from llm_health.remediator.rollout.gate import Measurement, Summary
from llm_health.remediator.rollout.procedure import Procedure
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

HOSTS = {"a1": "node-1", "a2": "node-1", "b1": "node-2", "b2": "node-2"}
NEW = ["deploy", "--version", "2", "{backend}", "{host}"]


class Gate:
    """The gate's Prometheus, scripted: a verdict per canary and the summary at the soak's end."""

    def __init__(self) -> None:
        self.verdict: Verdict | None = Verdict.BUSY
        self.error = ""
        self.result = Summary(requests=50, probes=2, error_ratio=0.0, fleet_error_ratio=0.0, ttft_p95=0.2,
                              fleet_ttft_p95=0.2, e2e_p95=1.0, fleet_e2e_p95=1.0, fleet=3)
        self.measured: list[str] = []
        self.summaries: list[tuple[str, tuple[str, ...], float]] = []

    def measure(self, canary: str) -> Measurement:
        self.measured.append(canary)
        return Measurement(verdict=self.verdict, error=self.error)

    def summary(self, canary: str, fleet: Sequence[str], window: float) -> Summary:
        self.summaries.append((canary, tuple(fleet), window))
        return self.result


def world(tmp_path: Path, gate: Gate, **settings: Any) -> World:
    w = fleet(tmp_path, tuple(HOSTS), HOSTS, min_ready=2,
              rollout={"prometheus_url": "http://127.0.0.1:9", "gate_interval": 1}, **settings)
    for name in HOSTS:
        w.work[name] = 0.0                   # idle: a drain ends at once
    w.authority.rollouts = Procedure(w.authority.ctx, gate)
    return w


def start(w: World, **body: Any) -> Any:
    return w.client.post("/api/rollouts", json={"command": NEW, "by": "ops@host1", "reason": "vLLM 0.9",
                                                "soak": 5, **body}, headers=AUTH)


def rollout(w: World, rid: int) -> dict[str, Any]:
    return w.client.get(f"/api/rollouts/{rid}").get_json()


def steps(w: World, rid: int) -> dict[str, str]:
    return {m["backend"]: m["step"] for m in rollout(w, rid)["members"]}


def out_at_once(w: World) -> list[set[str]]:
    """Every set of backends out of service at the same time, from the lifecycle events in order."""
    out: set[str] = set()
    seen: list[set[str]] = []
    for e in reversed(w.store.events(kind="lifecycle", limit=5000)):
        if e.detail["target"] in ("draining", "stopped", "initializing"):
            out.add(e.backend)
        elif e.detail["target"] == "ready":
            out.discard(e.backend)
        seen.append(set(out))
    return seen


def test_a_rollout_goes_canary_first_then_one_per_host_never_below_min_ready(tmp_path: Path) -> None:
    gate = Gate()
    w = world(tmp_path, gate)
    r = start(w)
    assert r.status_code == 201, r.get_json()
    rid = r.get_json()["id"]
    members = r.get_json()["members"]
    assert [(m["backend"], m["canary"]) for m in members] == [("a1", True), ("a2", False), ("b1", False),
                                                              ("b2", False)]
    assert members[0]["argv"] == ["deploy", "--version", "2", "a1", "node-1"] and members[0]["previous"] is None
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "the canary restarted and soaking")
    assert w.restarted == ["a1"] and w.calls == [("deploy", "--version", "2", "a1", "node-1")]
    assert set(steps(w, rid).values()) == {"soaking", "pending"}          # the others wait for the canary
    w.run_until(lambda: rollout(w, rid)["state"] == "succeeded", "the rollout succeeded", timeout=60)
    assert sorted(w.restarted) == ["a1", "a2", "b1", "b2"] and w.restarted[0] == "a1"
    assert gate.summaries and gate.summaries[0][:2] == ("a1", ("a2", "b1", "b2"))
    for out in out_at_once(w):
        assert len(out) <= 2 and len({HOSTS[n] for n in out}) == len(out)    # one per host, 2 of 4 stay READY
    commands = w.client.get("/api/rollouts").get_json()["commands"]
    assert commands["b2"]["argv"] == ["deploy", "--version", "2", "b2", "node-2"] and commands["b2"]["rollout_id"] == rid
    kinds = w.kinds()
    assert kinds.index("rollout_started") < kinds.index("rollout_soak_started") < kinds.index("rollout_gate_passed")
    assert kinds[-1] == "rollout_succeeded"
    page = w.client.get("/").get_data(as_text=True)
    assert f"Rollout {rid}: SUCCEEDED" in page and "deploy --version 2 {backend} {host}" in page
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert f'llm_health_remediator_rollout_state{{rollout="{rid}",state="succeeded"}} 1.0' in metrics
    assert f'llm_health_remediator_rollout_members{{rollout="{rid}",step="done"}} 4.0' in metrics
    assert 'llm_health_remediator_rollouts_total{result="succeeded"} 1.0' in metrics
    # a later automatic restart (an alert, verified stuck) runs the command the backend was rolled to
    w.calls.clear()
    w.deliver(payload(alert("b2")))
    w.run_until(lambda: w.calls, "b2 restarted by an alert")
    assert w.calls == [("deploy", "--version", "2", "b2", "node-2")]


def test_a_canary_failing_its_gate_is_rolled_back_and_the_others_untouched(tmp_path: Path) -> None:
    gate = Gate()
    w = world(tmp_path, gate)
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "soaking")
    answers = AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2)
    assert agent_reply(answers.status_for("a1")) == "ready up 25%"            # a reduced share while it soaks
    assert agent_reply(answers.status_for("a2")) == "ready up 100%"
    gate.verdict = Verdict.STALLED
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "rolled back", timeout=60)
    assert w.restarted == ["a1", "a1"]
    assert w.calls[1] == ("restart-a1",)                  # back to the configured command
    assert steps(w, rid) == {"a1": "rolled_back", "a2": "pending", "b1": "pending", "b2": "pending"}
    assert w.client.get("/api/rollouts").get_json()["commands"] == {}
    assert agent_reply(answers.status_for("a1")) == "ready up 100%"
    failed = w.events("a1", "rollout_gate_failed")[0]
    assert "stalled" in failed.reason


def test_a_canary_without_traffic_is_not_passed_unless_asked(tmp_path: Path) -> None:
    gate = Gate()
    gate.result = Summary(requests=0, probes=6, fleet=3)
    w = world(tmp_path, gate)
    rid = start(w).get_json()["id"]
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "no traffic: rolled back", timeout=60)
    reason = w.events("a1", "rollout_gate_failed")[0].reason
    assert "no user traffic" in reason and "6 idle probe(s)" in reason and "not been verified" in reason
    assert steps(w, rid)["a2"] == "pending"
    rid = start(w, pass_without_traffic=True).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "done", "passed without traffic", timeout=60)
    assert "passed anyway" in w.events("a1", "rollout_gate_passed")[0].reason


def test_a_failing_new_command_fails_the_member_and_rolls_back_at_once(tmp_path: Path) -> None:
    from llm_health.remediator import action

    gate = Gate()
    w = world(tmp_path, gate)
    w.result = action.ActionResult(action.FAILED, 3, "no such version")
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] in ("rolling_back", "rolled_back", "rollback_failed"), "a1 failed")
    w.result = action.ActionResult(action.OK, 0, "ok")
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "rolled back", timeout=60)
    assert w.calls == [tuple(NEW[:3]) + ("a1", "node-1"), ("restart-a1",)]
    assert "planned restart failed (exit 3)" in w.events("a1", "rollout_member_failed")[0].reason
    assert w.state("a1") == "ready"


def test_pause_holds_new_members_abort_rolls_back_and_both_are_audited(tmp_path: Path) -> None:
    gate = Gate()
    w = world(tmp_path, gate)
    rid = start(w).get_json()["id"]
    body = {"by": "ops@host1", "reason": "looking at the canary"}
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "soaking")
    assert w.client.post(f"/api/rollouts/{rid}/pause", json=body, headers=AUTH).get_json()["state"] == "paused"
    assert w.client.post(f"/api/rollouts/{rid}/pause", json=body).status_code == 401       # the token
    w.run_until(lambda: steps(w, rid)["a1"] == "done", "the canary soaks and passes while paused", timeout=60)
    w.run(10)
    assert steps(w, rid)["a2"] == "pending" and rollout(w, rid)["state"] == "paused"
    assert w.client.post(f"/api/rollouts/{rid}/resume", json=body, headers=AUTH).get_json()["state"] == "running"
    w.run_until(lambda: steps(w, rid)["a2"] != "pending", "a member starts after the resume")
    r = w.client.post(f"/api/rollouts/{rid}/abort", json=body, headers=AUTH)
    assert r.get_json()["state"] == "rolling_back"
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "aborted: rolled back", timeout=60)
    assert set(steps(w, rid).values()) <= {"rolled_back", "pending"} and steps(w, rid)["a1"] == "rolled_back"
    refused = w.client.post(f"/api/rollouts/{rid}/resume", json=body, headers=AUTH)
    assert refused.status_code == 409 and "rolled_back" in refused.get_json()["error"]
    kinds = w.kinds()
    assert {"rollout_paused", "rollout_resumed", "rollout_aborted", "rollout_rolled_back"} <= set(kinds)
    assert "ops@host1" in w.events("", "rollout_aborted")[0].reason


def test_an_incident_on_a_host_of_the_rollout_holds_it_and_the_breaker_refuses_a_start(tmp_path: Path) -> None:
    gate = Gate()
    w = world(tmp_path, gate)
    w.outcomes["b2"] = "unknown"                   # an alert the verification cannot confirm: stays open
    w.deliver(payload(alert("b2")))
    w.run(2)
    assert w.incident("b2") is not None
    rid = start(w).get_json()["id"]
    w.run(5)
    assert set(steps(w, rid).values()) == {"pending"} and "incident" in rollout(w, rid)["note"]
    w.deliver(payload(alert("b2", status="resolved")))
    w.run_until(lambda: steps(w, rid)["a1"] != "pending", "the canary starts once the incident closed")
    with w.store.tx() as tx:
        tx.open_breaker(w.clock(), "5 restarts in 1h")
    assert w.client.post(f"/api/rollouts/{rid}/abort", json={"by": "ops", "reason": "breaker"},
                         headers=AUTH).status_code == 200
    w.run_until(lambda: rollout(w, rid)["state"] != "rolling_back", "the abort ends", timeout=60)
    r = start(w)
    assert r.status_code == 409 and r.get_json()["refusal"] == "breaker_open"
    assert w.events("", "rollout_refused")


# -- the rollback's corner cases (found in review: each of these failed before its fix) -------------------
def test_a_member_held_past_its_deadline_is_called_off_and_never_runs_later(tmp_path: Path) -> None:
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.authority.rollouts.look(rid)                       # the canary's restart is asked for, not begun
    with w.store.tx() as tx:
        tx.open_breaker(w.clock(), "other failures")    # holds it back
    w.run(3)
    w.clock.advance(5000)                                # past member_timeout
    w.run(5)
    assert rollout(w, rid)["state"] == "rolled_back" and w.incident("a1") is None
    assert w.events("a1", "rollout_restart_called_off")
    with w.store.tx() as tx:
        tx.reset_breaker(w.clock())
    w.run(10)
    assert w.calls == [] and w.store.commands() == {}    # the rolled-back command never runs


def test_a_failing_rollback_is_not_retried_and_pages_until_acknowledged(tmp_path: Path) -> None:
    from llm_health.remediator import action

    gate = Gate()
    w = world(tmp_path, gate)
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "soaking")
    gate.verdict = Verdict.STALLED
    w.result = action.ActionResult(action.FAILED, 1, "previous command broken")
    w.run_until(lambda: rollout(w, rid)["state"] == "failed", "rollback failed", timeout=60)
    n = len(w.calls)
    for _ in range(50):
        w.clock.advance(30)
        w.run(1)
    assert len(w.calls) == n == 2                        # the new command, the failed rollback: no loop
    assert steps(w, rid)["a1"] == "rollback_failed"
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert f'llm_health_remediator_rollout_state{{rollout="{rid}",state="failed"}} 1.0' in metrics
    refused = start(w)
    assert refused.status_code == 409 and refused.get_json()["refusal"] == "failed_unacknowledged"
    body = {"by": "ops@host1", "reason": "repaired a1 by hand"}
    assert w.client.post(f"/api/rollouts/{rid}/ack", json=body, headers=AUTH).get_json()["state"] == "acknowledged"
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert 'llm_health_remediator_rollouts_total{result="failed"} 1.0' in metrics      # still counted
    w.result = action.ActionResult(action.OK, 0, "ok")
    assert start(w).status_code == 201


def test_a_canary_that_never_warms_up_is_rolled_back(tmp_path: Path) -> None:
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.ready["a1"] = False                               # the new version never answers
    w.run_until(lambda: w.calls, "a1 restarted with the new command")
    w.clock.advance(200)                                 # past warmup_timeout (100 s): needs_ack
    w.run(3)
    w.ready["a1"] = True                                 # the previous command works
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "rolled back", timeout=60)
    assert w.calls[-1] == ("restart-a1",) and len(w.calls) == 2 and w.state("a1") == "ready"


def test_an_abort_during_the_canarys_drain_runs_nothing(tmp_path: Path) -> None:
    w = world(tmp_path, Gate())
    w.work["a1"] = 1.0                                   # in flight: the drain waits
    rid = start(w).get_json()["id"]
    w.run_until(lambda: w.incident("a1") is not None and w.incident("a1").state.value == "draining", "draining")
    r = w.client.post(f"/api/rollouts/{rid}/abort", json={"by": "ops", "reason": "wrong image"}, headers=AUTH)
    assert r.get_json()["state"] == "rolling_back"
    w.work["a1"] = 0.0
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "rolled back", timeout=60)
    assert w.calls == [] and w.state("a1") == "ready" and w.store.commands() == {}


def test_a_gate_whose_summary_keeps_failing_fails_instead_of_soaking_forever(tmp_path: Path) -> None:
    gate = Gate()
    gate.result = Summary(error="the gate's time for its queries ran out")
    w = world(tmp_path, gate)
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "soaking")
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "the gate failed", timeout=60)
    reason = w.events("a1", "rollout_gate_failed")[0].reason
    assert "4 gate queries in a row failed" in reason and "ran out" in reason


def test_a_done_member_waiting_for_a_passing_incident_is_rolled_back_after_it(tmp_path: Path) -> None:
    """The wait for another incident has its own deadline, from when it began: a member done hours ago is not
    rollback_failed at once because an alert's incident is open for a moment."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "soaking")
    w.client.post(f"/api/rollouts/{rid}/pause", json={"by": "ops", "reason": "hold"}, headers=AUTH)
    w.run_until(lambda: steps(w, rid)["a1"] == "done", "the canary passed", timeout=60)
    w.clock.advance(5000)                                # long after
    w.outcomes["a1"] = "unknown"                         # an alert the verification cannot confirm: stays open
    w.deliver(payload(alert("a1")))
    w.run(2)
    assert w.incident("a1") is not None
    r = w.client.post(f"/api/rollouts/{rid}/abort", json={"by": "ops", "reason": "wrong image"}, headers=AUTH)
    assert r.status_code == 200
    w.run(5)
    assert steps(w, rid)["a1"] == "done" and "waits for incident" in rollout(w, rid)["members"][0]["note"]
    w.deliver(payload(alert("a1", status="resolved")))
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "rolled back after the incident", timeout=60)
    assert w.calls[-1] == ("restart-a1",)


def test_a_rollback_waits_for_a_restart_under_way_on_its_host(tmp_path: Path) -> None:
    """One per host, counting a member whose restart with the new command is still under way: the other
    member of that host is not asked for (its deadline would run while the host mutex holds it)."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "done", "the canary passed", timeout=60)
    w.ready["a2"] = False                                # a2 (node-1) will be warming up when the abort comes
    w.run_until(lambda: steps(w, rid)["a2"] == "restarting" and w.incident("a2") is not None
                and w.incident("a2").state.value == "warming", "a2 warming up")
    w.client.post(f"/api/rollouts/{rid}/abort", json={"by": "ops", "reason": "stop"}, headers=AUTH)
    w.run(3)
    assert steps(w, rid)["a1"] == "done" and "waits for its host" in rollout(w, rid)["members"][0]["note"]
    assert w.incident("a1") is None
    w.ready["a2"] = True
    w.run_until(lambda: rollout(w, rid)["state"] == "rolled_back", "rolled back", timeout=60)
