"""Acceptance for reviewer findings, with a real `llm-health remediator` (gunicorn, 4 workers), real
simulators and the real exporter.check.verify: incident dedup alone (no backoff, a large budget) gives
one restart per incident, and a hung server (accepts connections, never answers) is restarted exactly
once, only after `unresponsive_after`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from llm_health.simulator.server import Simulator

from tests.support.alerts import alert, payload
from tests.test_remediator_process import Rig, fire_at_once, running_rig

UNRESPONSIVE_AFTER = 3.0


def dedup_and_hang_settings(cfg: dict[str, Any]) -> None:
    cfg["exporter"]["read_timeout"] = 0.5
    cfg["remediator"].update({
        "backoff": {"initial": 0, "factor": 2, "cap": 0, "stable_after": 3600},   # nothing but dedup
        "budget": {"restarts": 100, "window": 3600}, "breaker": {"restarts": 100, "window": 3600},
        "unresponsive_after": UNRESPONSIVE_AFTER, "stalled_drain_timeout": 0.5,
    })


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with running_rig(tmp_path_factory.mktemp("remediator-fixes"), ("storm", "hung"), "remediator-fixes",
                     dedup_and_hang_settings) as r:
        yield r


def fault(sim: Simulator, name: str) -> None:
    requests.post(sim.control_url + "/sim/fault", json={"fault": name}, timeout=5).raise_for_status()


def test_dedup_alone_gives_one_restart_per_incident(rig: Rig) -> None:
    fault(rig.sims["storm"], "crash")
    first = payload(alert("storm"))
    bodies = [first] * 6 + [payload(alert("storm"), external="http://am-1:9093")] * 4 + [
        payload(alert("storm", alertname="LLMBackendDown")),
    ]
    assert fire_at_once(rig, bodies) == [202] * len(bodies)
    rig.wait_event("storm", "recovered")
    assert len(rig.events("storm", "incident_opened")) == 1
    assert len(rig.events("storm", "restarting")) == 1
    assert len(rig.calls_for("storm")) == 1
    assert requests.get(rig.sims["storm"].control_url + "/sim/stats", timeout=5).json()["restarts"] == 1
    assert rig.events("storm", "deferred_backoff") == []          # backoff never held anything back


def test_hung_server_is_restarted_once_after_unresponsive_after(rig: Rig) -> None:
    sim = rig.sims["hung"]
    fault(sim, "hang")
    assert rig.post(payload(alert("hung"))).status_code == 202
    rig.wait_event("hung", "recovered", timeout=60)
    deferred = [e for e in reversed(rig.events("hung", "deferred_unknown")) if "unresponsive" in e["reason"]]
    restarting = rig.events("hung", "restarting")
    draining = rig.events("hung", "draining")
    assert deferred, rig.events("hung")
    assert len(restarting) == 1 and len(rig.calls_for("hung")) == 1
    assert restarting[0]["at"] - deferred[0]["at"] >= UNRESPONSIVE_AFTER    # not before the window
    assert len(draining) == 1 and "no answer to /metrics for" in draining[0]["reason"]
    assert requests.get(sim.control_url + "/sim/stats", timeout=5).json()["restarts"] == 1
    assert requests.get(sim.url + "/health", timeout=5).ok
