"""The drain (remediator/restart/draining.py): every state of a restart and every view that shows it,
a drain that ends when nothing is in flight, and progress during it that calls the restart off; at the
end of a drain the backend is verified again (an alert resolved meanwhile, a drain without a reading).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_health.exporter.observation import Verification
from llm_health.remediator.inflight import InFlight
from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = fleet(tmp_path)
    yield world
    world.close()


def test_restart_goes_through_every_state_and_every_view_shows_it(w: World) -> None:
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining" and w.restarted == []
    view = {b["backend"]: b for b in w.client.get("/api/backends").get_json()["backends"]}
    assert view["gpu-a"]["lifecycle"]["state"] == "draining"
    assert view["gpu-a"]["lifecycle"]["since"] == w.clock.t
    assert view["gpu-a"]["incident"]["state"] == "draining"
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="draining"} 1')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="ready"} 0')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-b",state="ready"} 1')
    assert has_sample(metrics, f'llm_health_remediator_lifecycle_since_timestamp_seconds{{backend="gpu-a"}} {w.clock.t:.3f}')
    assert b"DRAINING" in w.client.get("/").data
    w.clock.advance(4.9)                           # stalled: waits only stalled_drain_timeout (5 s)
    w.run()
    assert w.state() == "draining" and w.restarted == []
    w.clock.advance(0.2)
    w.run()
    assert w.restarted == ["gpu-a"] and w.state() == "initializing"
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.steps() == [("initializing", "ready"), ("ready", "draining"), ("draining", "stopped"),
                         ("stopped", "initializing"), ("initializing", "ready")]
    kinds = w.kinds("gpu-a")
    assert kinds.index("draining") < kinds.index("restarting") < kinds.index("restarted") < kinds.index("recovered")
    assert w.store.active_incident("gpu-a") is None


def test_drain_ends_when_nothing_is_in_flight_any_more(w: World) -> None:
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining"
    w.work["gpu-a"] = 0.0                          # gone (e.g. cancelled by the client), counters unchanged
    w.clock.advance(0.2)
    w.run()
    assert w.restarted == ["gpu-a"] and w.steps()[2] == ("draining", "stopped")
    assert any(e.reason == "draining -> stopped: in-flight work finished"
               for e in w.store.events(kind="lifecycle", backend="gpu-a"))


def test_progress_during_the_drain_calls_the_restart_off(w: World) -> None:
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining"
    w.tokens["gpu-a"] += 5                         # the in-flight request finishes: the engine moved
    w.work["gpu-a"] = 0
    w.clock.advance(0.2)
    w.run()
    assert w.restarted == [] and w.state() == "ready"
    assert w.steps()[-2:] == [("ready", "draining"), ("draining", "ready")]
    assert "restart_called_off" in w.kinds("gpu-a") and w.store.active_incident("gpu-a") is None


def test_resolved_during_the_drain_and_verified_healthy_calls_the_restart_off(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining"
    w.deliver(payload(alert(status="resolved")))
    w.outcomes["gpu-a"] = "idle_ok"                # counters frozen, work stays: only a verification tells
    w.clock.advance(5)
    w.run()
    assert w.restarted == [] and w.state() == "ready"
    inc = w.last_incident()
    assert inc["state"] == "closed" and inc["close_reason"] == "verified_healthy"
    assert w.steps()[-1] == ("draining", "ready")


def test_resolved_during_the_drain_but_still_stalled_restarts(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.deliver(payload(alert()))
    w.run()
    w.deliver(payload(alert(status="resolved")))
    w.clock.advance(5)
    w.run()
    assert w.restarted == ["gpu-a"]
    assert "re-verified at the end of the drain" in w.store.events(kind="restarting")[0].reason


def test_drain_without_a_starting_reading_reverifies_before_the_restart(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    verified: list[str] = []
    outcomes = w.outcomes

    def verifier(b: Any) -> Verification:
        verified.append(b.name)
        return Verification(outcomes[b.name], "fake verifier")
    w.authority.io.verifier = verifier
    w.authority.io.in_flight = lambda b: InFlight(None, None, None, "reading failed")
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining" and verified == ["gpu-a"]
    outcomes["gpu-a"] = "progress"
    w.clock.advance(5)
    w.run()
    assert verified == ["gpu-a", "gpu-a"] and w.restarted == [] and w.state() == "ready"
    assert w.last_incident()["close_reason"] == "verified_healthy"
