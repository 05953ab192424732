"""/api (remediator/web/api.py): busy markers set, listed, removed and expiring, bad marker requests,
and what /api/backends, /api/events, /metrics and the status page show.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import AUTH, World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_api_busy_marker_defers_until_removed(w: World) -> None:
    r = w.client.post("/api/busy", json={"backend": "gpu-a", "owner": "batch-7", "ttl_seconds": 600}, headers=AUTH)
    assert r.status_code == 201
    marker = r.get_json()
    w.post(payload(alert()))
    w.run(5)
    assert w.calls == [] and w.verifications == 0
    deferred = w.store.events(kind="deferred_marker")
    assert len(deferred) == 1 and "batch-7" in deferred[0].reason
    view = w.client.get("/api/backends").get_json()["backends"][0]
    assert view["markers"][0]["owner"] == "batch-7"
    assert w.client.delete(f"/api/busy/{marker['id']}").status_code == 401
    assert w.client.delete(f"/api/busy/{marker['id']}", headers=AUTH).status_code == 200
    w.run()
    assert w.calls == [("restart-a", "--now")]


def test_api_marker_expires(w: World) -> None:
    w.client.post("/api/busy", json={"backend": "gpu-a", "owner": "batch", "ttl_seconds": 30}, headers=AUTH)
    w.post(payload(alert()))
    w.run()
    assert w.calls == []
    w.clock.advance(31)
    w.run()
    assert w.calls == [("restart-a", "--now")]


def test_bad_marker_requests(w: World) -> None:
    for body in ({"backend": "nope", "owner": "x"}, {"backend": "gpu-a"}, {"backend": "gpu-a", "owner": "x",
                 "ttl_seconds": -1}, {"backend": "gpu-a", "owner": "x", "ttl_seconds": "1"}):
        assert w.client.post("/api/busy", json=body, headers=AUTH).status_code in (400, 404)
    assert w.client.delete("/api/busy/nope", headers=AUTH).status_code == 404


def test_api_metrics_status_and_events(w: World) -> None:
    w.post(payload(alert()))
    w.post(payload(alert(backend="gpu-b", alertname="LLMHighErrorRate", restart=False)))
    w.run()
    backends = {b["backend"]: b for b in w.client.get("/api/backends").get_json()["backends"]}
    assert backends["gpu-a"]["incident"]["state"] == "warming"
    assert backends["gpu-a"]["restarts"] == {"ok": 1}
    assert backends["gpu-a"]["next_allowed_restart"] == w.clock.t + 100
    assert backends["gpu-b"]["last_decision"]["kind"] == "signal"
    events = w.client.get("/api/events?backend=gpu-b&limit=5").get_json()["events"]
    assert events and {e["backend"] for e in events} == {"gpu-b"}
    assert w.client.get("/api/events?limit=x").status_code == 400
    metrics = w.client.get("/metrics").get_data(as_text=True)
    for line in ('llm_health_remediator_alerts_received_total{status="firing"} 2',
                 'llm_health_remediator_decisions_total{decision="restarted"} 1',
                 'llm_health_remediator_decisions_total{decision="signal"} 1',
                 'llm_health_remediator_restarts_total{backend="gpu-a",result="ok"} 1',
                 "llm_health_remediator_breaker_open 0"):
        assert has_sample(metrics, line)
    page = w.client.get("/")
    assert page.status_code == 200 and b"gpu-a" in page.data and b"warming" in page.data
    assert w.client.get("/healthz").status_code == 200


def test_the_api_and_the_status_page_name_the_authority(tmp_path: Path) -> None:
    w = four_backends(tmp_path)
    try:
        lease = w.authority.lease
        got = w.client.get("/api/backends").get_json()["authority"]
        assert got["holder"] == lease.holder and got["epoch"] == lease.epoch and got["leading"] is True
        assert got["clock"] == ("database" if w.store.lease_clock() is not None else "host")
        page = w.client.get("/").get_data(as_text=True)
        assert f"Restart authority: <b>{lease.holder}</b> (epoch {lease.epoch}" in page
        if w.store.lease_clock() is not None:        # PostgreSQL: the database's clock says it ran out
            w.pass_time(lease.ttl + 1)
            got = w.client.get("/api/backends").get_json()["authority"]
            assert got["leading"] is False and got["seconds_left"] < 0
            assert "No leader" in w.client.get("/").get_data(as_text=True)
    finally:
        w.close()
