"""Operator commands through the API (remediator/operate.py): recorded with who asked and why, decided in
the store's transaction, and honoured by the agent, the gates and the reconciler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import agent_reply
from llm_health.remediator.lifecycle import LifecycleState
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

def command(w: World, name: str, what: str, reason: str = "kernel upgrade", force: bool = False,
            headers: dict[str, str] | None = None) -> Any:
    return w.client.post(f"/api/backends/{name}/{what}", json={"by": "ops@host1", "reason": reason, "force": force},
                         headers=AUTH if headers is None else headers)


def answer(w: World, name: str) -> str:
    return agent_reply(AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2).status_for(name))


def admin(w: World, name: str) -> str:
    return next(b for b in w.client.get("/api/backends").get_json()["backends"] if b["backend"] == name)["admin"]["state"]


def test_a_drain_stays_drained_until_undrained_and_is_audited(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1)
    w.run()
    assert answer(w, "gpu-a") == "ready up 100%"
    r = command(w, "gpu-a", "drain")
    assert r.status_code == 200 and r.get_json()["changed"] and r.get_json()["admin"] == "drained"
    for _ in range(3):                       # every agent check and every authority pass: still drained
        w.run()
        assert answer(w, "gpu-a") == "up drain #drained by ops host1: kernel upgrade"
    assert admin(w, "gpu-a") == "drained" and w.state("gpu-a") == "ready"
    event = w.events("gpu-a", "operator_drain")[0]
    assert "ops@host1" in event.reason and "kernel upgrade" in event.reason and event.detail["changed"] is True
    assert command(w, "gpu-a", "drain").get_json()["changed"] is False          # idempotent, also audited
    assert len(w.events("gpu-a", "operator_drain")) == 2
    assert command(w, "gpu-a", "undrain").get_json()["admin"] == "in_service"
    assert answer(w, "gpu-a") == "ready up 100%"
    assert 'llm_health_remediator_admin_state{backend="gpu-a",state="in_service"} 1.0' in w.client.get("/metrics").get_data(as_text=True)


def test_the_floor_refuses_the_last_serving_backend_unless_forced(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1)
    w.run()
    assert command(w, "gpu-a", "drain").status_code == 200
    r = command(w, "gpu-b", "drain")
    assert r.status_code == 409 and r.get_json()["refusal"] == "min_ready" and admin(w, "gpu-b") == "in_service"
    assert w.events("gpu-b", "operator_refused")
    r = command(w, "gpu-b", "retire", force=True)
    assert r.status_code == 200 and r.get_json()["forced"] is True
    assert "forced" in w.events("gpu-b", "operator_retire")[0].reason


def test_bad_requests_change_nothing(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"))
    w.run()
    assert command(w, "gpu-a", "drain", headers={}).status_code == 401
    assert command(w, "nope", "drain").status_code == 404
    assert command(w, "gpu-a", "drain", reason=" ").status_code == 400
    assert w.client.post("/api/backends/gpu-a/drain", json={"reason": "x"}, headers=AUTH).status_code == 400
    assert w.client.post("/api/backends/gpu-a/drain", json={"by": "a", "reason": "x", "force": "yes"},
                         headers=AUTH).status_code == 400
    assert w.client.post("/api/backends/gpu-a/explode", json={"by": "a", "reason": "x"}, headers=AUTH).status_code == 404
    assert admin(w, "gpu-a") == "in_service" and not w.events("gpu-a", "operator_drain")


def test_a_retired_backend_is_out_of_every_decision_until_activated(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), min_ready=1)
    w.run()
    w.deliver(payload(alert("gpu-a")))                     # waiting for its verification
    assert command(w, "gpu-a", "retire", reason="hardware fault").status_code == 200
    assert w.last_incident("gpu-a")["state"] == "closed" and w.last_incident("gpu-a")["close_reason"] == "retired"
    assert answer(w, "gpu-a") == "maint #retired by ops host1: hardware fault"
    w.deliver(payload(alert("gpu-a", alertname="LLMBackendDown")))   # a new alert never brings it back
    w.run()
    assert w.restarted == [] and w.last_incident("gpu-a")["close_reason"].startswith("gpu-a is retired")
    assert w.events("gpu-a", "retired_ignored")
    assert answer(w, "gpu-a").startswith("maint")
    # it counts toward no floor: with gpu-a retired, gpu-b may go only while gpu-c serves
    assert command(w, "gpu-b", "drain").status_code == 200
    assert command(w, "gpu-c", "drain").status_code == 409
    assert command(w, "gpu-a", "activate", reason="repaired").get_json()["admin"] == "in_service"
    assert answer(w, "gpu-a") == "ready up 100%"


def test_a_drained_backend_counts_toward_no_restart_floor(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1)
    w.run()
    assert command(w, "gpu-b", "drain").status_code == 200
    w.deliver(payload(alert("gpu-a")))
    w.run()
    assert w.restarted == [] and w.events("gpu-a", "deferred_min_ready")
    assert "only 0 other backend(s) READY" in w.events("gpu-a", "deferred_min_ready")[0].reason


def test_the_floor_never_lets_a_backend_that_is_not_ready_in(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=2)
    with w.store.tx() as tx:
        assert tx.move_lifecycle("gpu-a", LifecycleState.ERROR, w.clock(), "start failed")
    # only one other backend is up, below min_ready 2: a READY backend would be kept up, an ERROR one never
    assert answer(w, "gpu-a") == "down #error: start failed"
    assert answer(w, "gpu-b") == "ready up 100%"


def test_a_drained_backend_is_not_restarted_until_undrained(tmp_path: Path) -> None:
    """The operator holds it (maybe to take a py-spy dump): an alert parks its incident; undrain re-opens it."""
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), min_ready=1)
    w.run()
    assert command(w, "gpu-a", "drain", reason="collecting a dump").status_code == 200
    w.deliver(payload(alert("gpu-a")))
    w.run()
    assert w.restarted == [] and w.last_incident("gpu-a")["state"] == "observed"
    assert "collecting a dump" in w.events("gpu-a", "held_by_operator")[0].reason
    assert command(w, "gpu-a", "undrain", reason="dump taken").status_code == 200
    assert w.last_incident("gpu-a")["state"] == "open" and w.events("gpu-a", "reopened")
    w.run_until(lambda: w.restarted == ["gpu-a"], "gpu-a restarted once it is back in service")


def test_a_restart_asked_for_drains_restarts_and_warms_up_a_healthy_backend(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1)
    w.outcomes["gpu-a"] = "progress"                     # healthy: an alert would never restart it
    before = w.verifications
    r = command(w, "gpu-a", "restart", reason="vLLM upgrade")
    assert r.status_code == 200 and r.get_json()["incident"] is not None
    w.run()
    assert w.state("gpu-a") == "draining" and w.restarted == []
    w.tokens["gpu-a"] += 50                              # it makes progress while draining: never a call-off
    w.run()
    assert w.state("gpu-a") == "draining"
    w.work["gpu-a"] = 0                                  # the in-flight request finished
    w.run_until(lambda: w.restarted == ["gpu-a"] and w.state("gpu-a") == "ready", "restarted and READY")
    w.run_until(lambda: w.last_incident("gpu-a")["state"] == "closed", "incident closed after warm-up")
    assert w.verifications == before                     # an operator's word is not re-verified
    kinds = w.kinds("gpu-a")
    assert kinds.index("operator_restart") < kinds.index("draining") < kinds.index("restarting")
    assert "restart_called_off" not in kinds


def test_a_restart_asked_for_keeps_the_floor_and_busy_markers_unless_forced(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1)
    w.run()
    assert command(w, "gpu-b", "drain").status_code == 200
    assert command(w, "gpu-a", "restart", reason="upgrade").status_code == 200
    w.run()
    assert w.state("gpu-a") == "ready" and w.events("gpu-a", "deferred_min_ready")
    assert command(w, "gpu-a", "restart", reason="upgrade now", force=True).get_json()["forced"] is True
    w.work["gpu-a"] = 0
    w.run_until(lambda: w.restarted == ["gpu-a"], "forced restart")
    w.run_until(lambda: w.last_incident("gpu-a")["state"] == "closed", "warm")
    marker = w.client.post("/api/busy", json={"backend": "gpu-b", "owner": "batch", "ttl_seconds": 600}, headers=AUTH)
    assert marker.status_code == 201
    assert command(w, "gpu-b", "restart", reason="upgrade").status_code == 200      # drained: costs no capacity
    w.run()
    assert w.restarted == ["gpu-a"] and w.events("gpu-b", "deferred_marker")


def test_a_restart_is_refused_when_it_cannot_be_carried_out(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"))
    w.run()
    assert command(w, "gpu-a", "restart").status_code == 200
    w.run()
    assert w.state("gpu-a") == "draining"
    again = command(w, "gpu-a", "restart")
    assert again.status_code == 409 and again.get_json()["refusal"] == "restarting"
    assert command(w, "gpu-b", "retire", force=True).status_code == 200
    assert command(w, "gpu-b", "restart").get_json()["refusal"] == "conflict"


def test_drain_min_holds_a_drained_backend_until_the_load_balancer_has_let_go(tmp_path: Path) -> None:
    """Kubernetes: the endpoint update follows the readiness sidecar's next answer, seconds after the drain."""
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1, drain_min=20)
    w.run()
    w.work["gpu-a"] = 0                                  # nothing in flight: drained at once
    assert command(w, "gpu-a", "restart", reason="upgrade").status_code == 200
    w.run()
    assert w.state("gpu-a") == "draining"
    w.clock.advance(10)
    w.run()
    assert w.state("gpu-a") == "draining" and w.restarted == []
    w.clock.advance(11)
    w.run_until(lambda: w.restarted == ["gpu-a"], "restarted once drain_min has passed")
