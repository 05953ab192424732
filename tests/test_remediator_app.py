"""The remediator in-process: Flask test client + an Authority driven tick by tick with a fake clock.

The verifier, warm-up check and action runner are injected (recorded, no sleeping); the SQLite
store, the webhook, the API and the authority are the real ones.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_health.remediator import action
from llm_health.remediator.authority import Authority
from llm_health.remediator.store import IncidentState

from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import AUTH, TOKEN, World, four_backends


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


# -- receiving -------------------------------------------------------------------------------------
def test_duplicate_storm_gives_one_incident_and_one_restart(w: World) -> None:
    first = payload(alert())
    assert w.post(first).status_code == 202
    assert w.post(first).status_code == 202                                     # resend
    assert w.post(payload(alert(), external="http://am-1:9093")).status_code == 202  # HA replica
    assert w.post(payload(alert(alertname="LLMBackendDown"))).status_code == 202    # another alert name
    both = payload(alert(), alert(alertname="LLMBackendDown"), alert(alertname="LLMHighErrorRate", restart=False))
    assert w.post(both).status_code == 202
    w.run(5)
    w.post(first)
    w.post(payload(alert(alertname="LLMBackendDown", starts_at="2026-11-30T00:03:00Z")))
    w.run(5)
    assert w.calls == [("restart-a", "--now")]
    kinds = w.kinds("gpu-a")
    assert kinds.count("incident_opened") == 1
    assert kinds.count("restarting") == 1 and kinds.count("restarted") == 1
    assert "absorbed" in kinds and "signal" in kinds
    assert len(w.store.events(kind="deduplicated")) == 3
    assert w.envs[0]["LLM_HEALTH_BACKEND"] == "gpu-a"


def test_instance_label_routes_to_backend(w: World) -> None:
    w.post(payload(alert(backend=None, instance="127.0.0.1:18002")))
    w.run()
    assert w.calls == [("restart-b",)]


def test_signal_only_alert_never_restarts(w: World) -> None:
    w.post(payload(alert(alertname="LLMHighErrorRate", restart=False)))
    w.run()
    assert w.calls == [] and w.incident() is None
    assert w.kinds("gpu-a") == ["signal"]


def test_unknown_backend_and_shell_metacharacters_change_nothing(w: World) -> None:
    evil = "gpu-a; rm -rf / #$(touch /tmp/pwned)`id`"
    w.post(payload(alert(backend=evil)))
    w.post(payload(alert(backend=None, instance="10.9.9.9:8000")))
    w.post(payload(alert(backend=None)))
    w.run()
    assert w.calls == []
    assert w.store.active_incidents() == []
    assert len(w.store.events(kind="ignored")) == 3
    # labels full of metacharacters on a known backend: the argv is still exactly the configured one
    w.post(payload(alert(job="$(reboot)", note="; shutdown -h now | `id` && echo")))
    w.run()
    assert w.calls == [("restart-a", "--now")]


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": f"Basic {TOKEN}"}, 401), (AUTH, 202)],
)
def test_webhook_requires_the_token(w: World, headers: dict[str, str], status: int) -> None:
    assert w.post(payload(alert()), headers=headers).status_code == status
    assert (w.incident() is not None) == (status == 202)


def test_bad_bodies_are_refused_and_change_nothing(w: World) -> None:
    bad = [
        (b"{not json", 400),
        (b"", 400),
        (b"[]", 400),
        (b'{"alerts": "x"}', 400),
        (b'{"version": "3", "alerts": []}', 400),
        (b'{"alerts": [{"status": "firing", "labels": {"a": 1}}]}', 400),
        (b'{"alerts": [{"status": "exploded", "labels": {}}]}', 400),
        (b'{"alerts": [{"status": "firing", "labels": {"backend": "gpu-a"}}]}' + b" " * 2_000_000, 413),
    ]
    for body, status in bad:
        r = w.client.post("/webhook", data=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == status, body[:60]
        assert r.get_json()["error"]
    w.run()
    assert [e for e in w.store.events(limit=10) if e.kind != "lease_acquired"] == []
    assert w.store.active_incidents() == [] and w.calls == [] and w.store.counters("alerts_received") == {}


def chunked_post(w: World, body: bytes) -> Any:
    """A chunked request as gunicorn hands it over: no Content-Length, a terminated input stream."""
    return w.client.post("/webhook", input_stream=io.BytesIO(body), environ_overrides={"wsgi.input_terminated": True},
                         headers={**AUTH, "Content-Type": "application/json", "Transfer-Encoding": "chunked"})


def test_chunked_body_over_the_limit_gets_413(w: World) -> None:
    """Issue 18: a 2 MB chunked body of spaces was read as the first max_body_bytes of it: 400 "empty body"."""
    limit = 1_048_576
    body = json.dumps(payload(alert())).encode()
    for size, status in ((2_000_000, 413), (limit + 1, 413), (limit, 202)):
        r = chunked_post(w, body + b" " * (size - len(body)))
        assert r.status_code == status, (size, r.get_json())
        if status == 413:
            assert r.get_json()["error"] == f"body too large: more than {limit} bytes"
    assert len(w.store.events(kind="received")) == 1                   # the one within the limit


def test_unknown_keys_are_ignored(w: World) -> None:
    body = payload(alert(), notification_reason="new", routeLabels={"x": "y"})
    body["alerts"][0]["somethingNew"] = 1
    assert w.post(body).status_code == 202


# -- deciding --------------------------------------------------------------------------------------
def test_backend_that_recovered_is_not_restarted(w: World) -> None:
    w.outcomes["gpu-a"] = "progress"
    w.post(payload(alert()))
    w.run()
    assert w.calls == [] and w.incident() is None
    assert "verified_healthy" in w.kinds("gpu-a")


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


def test_file_marker_defers_and_expired_file_is_ignored(w: World, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    marker = busy / "gpu-a@nightly-eval"
    marker.write_text("ttl=600\n")
    os.utime(marker, (w.clock.t, w.clock.t))
    (busy / "gpu-ab").write_text("")                  # another name: not a marker for gpu-a
    holds_for_its_ttl(w, 601)


def holds_for_its_ttl(w: World, ttl: float) -> None:
    """An alert about gpu-a: deferred by the marker, then restarted once `ttl` has passed."""
    w.post(payload(alert()))
    w.run()
    assert w.calls == [] and w.kinds("gpu-a")[-1] == "deferred_marker"
    w.clock.advance(ttl)
    w.run()
    assert w.calls == [("restart-a", "--now")]


def test_file_marker_with_a_future_mtime_holds_for_its_ttl_only(w: World, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    marker = busy / "gpu-a@skewed"
    marker.write_text("ttl=600\n")
    w.clock.t = time.time()                           # the kernel's ctime of the file is real time
    future = w.clock.t + 3650 * 86400                 # seen in the field: a marker valid for ten years
    os.utime(marker, (future, future))
    holds_for_its_ttl(w, 601)


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


def test_resolved_closes_an_open_incident(w: World) -> None:
    w.client.post("/api/busy", json={"backend": "gpu-a", "owner": "x", "ttl_seconds": 600}, headers=AUTH)
    w.post(payload(alert(), alert(alertname="LLMBackendDown")))
    w.run()
    w.post(payload(alert(status="resolved")))
    assert w.incident() is not None          # the other alert still fires
    w.post(payload(alert(alertname="LLMBackendDown", status="resolved")))
    assert w.incident() is None and "resolved" in w.kinds("gpu-a")


# -- acting and warm-up ------------------------------------------------------------------------------
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


def test_timed_out_action_is_never_retried_blindly(w: World) -> None:
    w.result = action.ActionResult(action.TIMEOUT, None, "killed")
    w.post(payload(alert()))
    w.run()
    w.clock.advance(100_000)
    w.run()
    assert len(w.calls) == 1 and w.incident().state == "needs_ack"
    w.ready["gpu-a"] = True                  # it does answer again: the incident closes by itself
    w.clock.advance(10)
    w.run()
    assert w.incident() is None and w.kinds("gpu-a")[-1] == "recovered"


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


# -- state ---------------------------------------------------------------------------------------------
def test_interrupted_restart_is_not_repeated(w: World) -> None:
    """A restart whose intent is recorded by a holder that died: the next authority never repeats it."""
    w.post(payload(alert()))
    with w.store.tx() as tx:
        inc = tx.active_incident("gpu-a")
        tx.add_action(inc.id, "gpu-a", "restart-a", "dead-worker", w.clock.t, w.clock.t, "")
        tx.move_incident(inc.id, w.clock.t, IncidentState.RESTARTING)
    w.run()
    w.clock.advance(100_000)
    w.post(payload(alert(alertname="LLMBackendDown")))
    w.run()
    assert w.calls == []
    assert w.incident().state == "needs_ack"
    assert "interrupted" in w.kinds("gpu-a")


def test_only_one_lease_holder(w: World) -> None:
    other = Authority(w.store, w.authority.ctx.config, clock=w.clock, holder="other")
    assert not other.lease.renew()
    w.clock.advance(w.authority.lease.ttl + 1)
    assert other.lease.renew()
    assert not w.authority.lease.renew()


# -- interfaces ----------------------------------------------------------------------------------------
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


def test_monotonic_deadlines_are_shown_as_wall_time() -> None:
    # The authority stores deadlines on the monotonic clock; the API and status page show wall time.
    from llm_health.remediator.clock import Clocks
    from llm_health.remediator.web.views import MONOTONIC_INCIDENT_FIELDS, shown

    clocks = Clocks(wall=lambda: 1_700_000_000.0, mono=lambda: 500.0)
    row = {"id": 1, "opened_at": 1_699_999_990.0, "next_check_at": 510.0, "warm_deadline": None,
           "unresponsive_since": 470.0}
    view = shown(clocks, row, MONOTONIC_INCIDENT_FIELDS)
    assert view["next_check_at"] == 1_700_000_010.0
    assert view["unresponsive_since"] == 1_699_999_970.0
    assert view["warm_deadline"] is None
    assert view["opened_at"] == row["opened_at"]  # wall time already: untouched


def test_a_discovered_backend_mid_restart_survives_a_remediator_start_while_prometheus_is_down(w: World) -> None:
    """The remediator (re)starts while Prometheus is down (a host reboot): its discovery has no answer, so
    a discovered backend in the middle of a restart is unknown. Its incident must not be closed as 'no
    longer configured' (that left the lifecycle owned by a closed incident: host mutex held, every later
    restart of the backend deferred forever). Once discovery answers without it, the incident closes
    and the lifecycle is released."""
    import dataclasses

    from llm_health.config import DiscoverySettings
    from llm_health.discovery import Discovery, LiveBackends

    w.post(payload(alert()))
    w.run(3)
    assert w.incident().state == "warming"                    # restarted, not warm yet (ready False)
    config = w.authority.ctx.config
    gpu_a = config.backend("gpu-a")
    answer: dict[str, Any] = {"targets": None}

    def fetch() -> list[Any]:
        if answer["targets"] is None:
            raise OSError("connection refused")                  # Prometheus down
        return answer["targets"]

    d = Discovery(DiscoverySettings(prometheus_url="http://127.0.0.1:9", selector='job="vllm"'),
                  static=(), fetch=fetch)
    static = tuple(b for b in config.backends if b.name != "gpu-a")
    live = dataclasses.replace(config, backends=LiveBackends(static, d))
    w.authority.ctx.config = live
    d.refresh()
    w.clock.advance(10)
    w.run(3)
    inc = w.incident()
    assert inc is not None and inc.state == "warming"
    assert "waiting_for_discovery" in w.kinds("gpu-a")
    answer["targets"] = []                                       # answers, gpu-a really gone
    w.clock.advance(10)
    w.run(3)
    assert w.incident() is not None                              # no good answer yet: kept
    d.refresh()                                                  # the refresher thread's job (not started here)
    w.clock.advance(10)
    w.run(3)
    assert w.incident() is None
    with w.store.reader() as rd:
        r = rd.lifecycle("gpu-a")
        assert r.state == "error" and r.incident_id is None
    assert gpu_a is not None
