"""After the action (remediator/restart/warmup.py): alerts during the warm-up are absorbed, a warm backend
recovers, a warm-up timeout needs an acknowledgement (ERROR, escalated) and is never restarted in a loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import AUTH, World, fleet, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_warmup_absorbs_alerts_then_recovers(w: World) -> None:
    w.post(payload(alert()))
    w.run()
    assert w.incident().state == "warming"
    w.post(payload(alert(alertname="LLMBackendDown")))
    w.post(payload(alert(status="resolved")))                # mid-restart: noted, not closed
    w.clock.advance(5)
    w.run()
    assert w.incident().state == "warming"
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.incident() is None
    assert w.calls == [("restart-a", "--now")]
    assert w.kinds("gpu-a")[-1] == "recovered"


def test_warmup_timeout_needs_ack(w: World) -> None:
    w.post(payload(alert()))
    w.run()
    w.clock.advance(101)
    w.run()
    assert w.incident().state == "needs_ack" and "warmup_timeout" in w.kinds("gpu-a")
    w.clock.advance(10_000)
    w.post(payload(alert(starts_at="2026-11-30T09:00:00Z")))
    w.run()
    assert len(w.calls) == 1                 # never restarted blindly
    assert w.client.post("/api/backends/gpu-a/ack").status_code == 401
    assert w.client.post("/api/backends/gpu-a/ack", headers=AUTH).status_code == 200
    assert w.incident() is None


def test_warmup_timeout_is_error_escalated_and_not_restarted_in_a_loop(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.run()
    w.clock.advance(5)
    w.run()
    assert w.state() == "initializing"
    w.clock.advance(101)
    w.run()
    assert w.state() == "error" and w.steps()[-1] == ("initializing", "error")
    assert "escalated" in w.kinds("gpu-a") and "warmup_timeout" in w.kinds("gpu-a")
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, 'llm_health_remediator_escalations_total{backend="gpu-a"} 1')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="error"} 1')
    page = w.client.get("/").get_data(as_text=True)
    assert "ERROR" in page and "escalated" in page
    w.clock.advance(10_000)
    w.deliver(payload(alert(starts_at="2026-11-30T09:00:00Z")))
    w.run(5)
    assert w.restarted == ["gpu-a"]                   # never restarted again by itself
    assert w.client.post("/api/backends/gpu-a/ack", headers=AUTH).status_code == 200
    w.run()
    assert w.state() == "error"                   # acknowledged, but not warm yet
    w.ready["gpu-a"] = True
    w.clock.advance(29)                           # an ERROR backend is checked at most every 30 s
    w.run()
    assert w.state() == "error"
    w.clock.advance(1)
    w.run()
    assert w.state() == "ready" and w.steps()[-2:] == [("error", "initializing"), ("initializing", "ready")]
