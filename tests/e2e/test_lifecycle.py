"""Acceptance for the restart lifecycle: a real `llm-health remediator` (gunicorn, 2 workers) with its
agent-check listener, a real HAProxy 2.6 (config derived from deploy/haproxy/haproxy.cfg, agent pointing at
the remediator) and in-process simulators. Restart actions record their start and end times and restart
the simulator through `python -m llm_health.simulator.ctl restart`. Alerts are posted to the webhook as Alertmanager
would send them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from llm_health.config import Backend
from llm_health.remediator.inflight import read_in_flight
from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.lifecycle_rig import HAPROXY, build_rig
from tests.support.remediator_process import RemediatorRig, stop_rig

RESTARTING = ("draining", "stopped", "initializing")

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(HAPROXY is None, reason="haproxy not installed")]

def timeline(events: list[dict[str, Any]], names: list[str]) -> list[dict[str, str]]:
    """Every backend's lifecycle state after each `lifecycle` event (audit log order)."""
    states = dict.fromkeys(names, "ready")
    out = [dict(states)]
    for e in events:
        if e["kind"] == "lifecycle" and e["backend"] in states:
            assert e["detail"]["source"] == states[e["backend"]], e
            states[e["backend"]] = e["detail"]["target"]
            out.append(dict(states))
    return out


@pytest.fixture
def rig_lb(tmp_path: Path) -> Iterator[RemediatorRig]:
    """gpu-a and gpu-b on different hosts behind HAProxy, min_ready 1."""
    rig = build_rig(tmp_path, {"gpu-a": "node-1", "gpu-b": "node-2"}, lb=True, min_ready=1)
    yield rig
    stop_rig(rig)


def listeners(port: int) -> int:
    """Sockets in LISTEN state on 127.0.0.1:port (from /proc/net/tcp)."""
    want = f"0100007F:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for ln in lines if ln.split()[1] == want and ln.split()[3] == "0A")


# ---------------------------------------------------------------------------------------------------------

def test_restart_walks_every_state_and_traffic_returns_only_after_warmup(rig_lb: RemediatorRig) -> None:
    rig = rig_lb
    rig.wait(lambda: listeners(rig.agent_port) == 1, "one agent listener")   # two gunicorn workers, one listener
    assert {rig.served_by() for _ in range(6)} == {"gpu-a", "gpu-b"}

    rig.stall_with_work("gpu-a")
    rig.post(payload(alert("gpu-a")))
    rig.wait(lambda: not rig.stats()["gpu-a"].up, "HAProxy takes gpu-a out")
    taken_out = time.time()

    sent: list[tuple[float, str]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            at = time.time()
            resp = rig.complete(f"s-{uuid.uuid4().hex[:10]}")
            sent.append((at, resp.json()["model"] if resp.status_code == 200 else f"HTTP {resp.status_code}"))

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        ready = rig.wait(lambda: next((e for e in rig.events("gpu-a", "lifecycle")
                                       if e["detail"]["target"] == "ready"), None), "gpu-a READY again")
        rig.wait(lambda: any(m == "gpu-a" for _, m in sent), "gpu-a serves through HAProxy again")
    finally:
        stop.set()
        worker.join(timeout=15)

    steps = [(e["detail"]["source"], e["detail"]["target"]) for e in rig.events("gpu-a", "lifecycle")]
    assert steps == [("ready", "draining"), ("draining", "stopped"), ("stopped", "initializing"),
                     ("initializing", "ready")], steps
    during = [m for at, m in sent if taken_out <= at < ready["at"]]
    assert during and set(during) == {"gpu-b"}, f"requests during the restart: {sorted(set(during))}"
    first_a = min(at for at, m in sent if m == "gpu-a")
    assert first_a >= ready["at"]
    assert rig.sims["gpu-a"].stats_json()["restarts"] == 1
    assert [a[:2] for a in rig.actions()] == [("start", "gpu-a"), ("end", "gpu-a")]
    kinds = [e["kind"] for e in rig.events("gpu-a")]
    assert kinds.index("draining") < kinds.index("restarting") < kinds.index("restarted") < kinds.index("recovered")
    metrics = requests.get(rig.url + "/metrics", timeout=5).text
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="ready"} 1')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="draining"} 0')
    assert has_sample(metrics, f'llm_health_remediator_lifecycle_since_timestamp_seconds{{backend="gpu-a"}} {ready["at"]!r}')


def test_min_ready_holds_when_every_backend_stalls(rig_lb: RemediatorRig) -> None:
    """Policy: a stalled backend that still answers is not down, so it counts as READY for the floor and
    is only restarted while at least min_ready (1) other backends are READY: one restarts, the other waits."""
    rig = rig_lb
    rig.stall_with_work("gpu-a")
    rig.stall_with_work("gpu-b")
    rig.post(payload(alert("gpu-a"), alert("gpu-b")))
    rig.wait(lambda: len([e for e in rig.events(kind="lifecycle") if e["detail"]["target"] == "ready"]) == 2,
             "both restarted and READY", timeout=45)
    events = rig.events()
    states = timeline(events, ["gpu-a", "gpu-b"])
    assert all(sum(1 for s in st.values() if s == "ready") >= 1 for st in states), states
    first = next(e["backend"] for e in events if e["kind"] == "draining")
    second = "gpu-b" if first == "gpu-a" else "gpu-a"
    deferred = [e for e in events if e["kind"] == "deferred_min_ready"]
    assert deferred and {e["backend"] for e in deferred} == {second}
    first_ready = next(e["id"] for e in events if e["kind"] == "lifecycle" and e["backend"] == first
                       and e["detail"]["target"] == "ready")
    second_drain = next(e["id"] for e in events if e["kind"] == "draining" and e["backend"] == second)
    assert first_ready < second_drain
    assert [s.stats_json()["restarts"] for s in rig.sims.values()] == [1, 1]


def test_drained_backend_gets_no_new_requests_while_in_flight_ones_complete(tmp_path: Path) -> None:
    """Long stalled_drain_timeout: the stall clears during the drain, the in-flight request completes on
    gpu-a, nothing new reaches it, and the progress calls the restart off (DRAINING -> READY)."""
    rig = build_rig(tmp_path, {"gpu-a": "node-1", "gpu-b": "node-2"}, lb=True, stalled_drain_timeout=60)
    try:
        sticky = next(s for s in (f"s-{uuid.uuid4().hex[:10]}" for _ in range(200)) if rig.served_by(s) == "gpu-a")
        rig.wait(lambda: rig.stats()["gpu-a"].current_sessions == 0, "HAProxy at rest")
        a = rig.sims["gpu-a"]
        result: dict[str, requests.Response] = {}

        def in_flight() -> None:
            result["r"] = requests.post(rig.lb_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 300},
                                        headers={"X-Session-Id": sticky}, timeout=60)

        worker = threading.Thread(target=in_flight, daemon=True)
        worker.start()
        rig.wait(lambda: a.stats_json()["running"] == 1, "one request running on gpu-a")
        a.set_fault("stall")
        rig.post(payload(alert("gpu-a")))
        rig.wait(lambda: rig.lifecycle()["gpu-a"] == "draining", "gpu-a DRAINING")
        rig.wait(lambda: rig.stats()["gpu-a"].draining or rig.stats()["gpu-a"].down, "HAProxy stops gpu-a")
        assert rig.stats()["gpu-a"].current_sessions == 1
        seen = read_in_flight(Backend("gpu-a", a.url), 2.0, rig.socket_path, "vllm")   # what the drain reads
        assert (seen.work, seen.sessions, seen.drained) == (1, 1, False)
        generations = a.stats_json()["by_kind"]["generation"]
        served = [rig.served_by(s) for s in [sticky, *(f"s-{uuid.uuid4().hex[:10]}" for _ in range(30))]]
        assert set(served) == {"gpu-b"}, served
        assert a.stats_json()["by_kind"]["generation"] == generations        # nothing new reached gpu-a
        assert worker.is_alive() and rig.lifecycle()["gpu-a"] == "draining"
        a.set_fault("none")                                                  # the engine moves again
        worker.join(timeout=30)
        assert result["r"].status_code == 200 and result["r"].json()["model"] == "gpu-a"
        rig.wait(lambda: rig.lifecycle()["gpu-a"] == "ready", "restart called off: READY")
        steps = [(e["detail"]["source"], e["detail"]["target"]) for e in rig.events("gpu-a", "lifecycle")]
        assert steps == [("ready", "draining"), ("draining", "ready")]
        assert "restart_called_off" in [e["kind"] for e in rig.events("gpu-a")]
        assert rig.actions() == [] and a.stats_json()["restarts"] == 0
        rig.wait(lambda: rig.stats()["gpu-a"].up, "gpu-a UP in HAProxy again")
    finally:
        stop_rig(rig)


def test_two_backends_on_one_host_never_restart_together(tmp_path: Path) -> None:
    rig = build_rig(tmp_path, {"c1": "node-x", "c2": "node-x", "d1": "node-y"}, lb=False)
    try:
        for name in rig.sims:
            rig.stall_with_work(name)
        rig.post(payload(*(alert(n) for n in rig.sims)))
        rig.wait(lambda: len([e for e in rig.events(kind="lifecycle") if e["detail"]["target"] == "ready"]) == 3,
                 "all three restarted and READY", timeout=45)
        events = rig.events()
        for st in timeline(events, list(rig.sims)):
            assert not (st["c1"] in RESTARTING and st["c2"] in RESTARTING), st
        acts = rig.actions()
        start = {n: t for k, n, t in acts if k == "start"}
        end = {n: t for k, n, t in acts if k == "end"}
        assert set(start) == set(end) == {"c1", "c2", "d1"}
        first, second = sorted(("c1", "c2"), key=lambda n: start[n])
        ready_at = next(e["at"] for e in events if e["kind"] == "lifecycle" and e["backend"] == first
                        and e["detail"]["target"] == "ready")
        assert end[first] <= ready_at <= start[second]
        assert [e["backend"] for e in events if e["kind"] == "deferred_host"] == [second]
        assert all(s.stats_json()["restarts"] == 1 for s in rig.sims.values())
    finally:
        stop_rig(rig)
