"""Headroom before a start, through a real remediator (gunicorn) and the real action wrapper: the simulated
vLLM crashed (its old process "stays behind"), the stop is recorded, the headroom check polled (each
check recorded), the start (a simulator restart) comes only once it passes; or never."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from llm_health.drill.procs import free_port, wait_until
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.alerts import alert, payload
from tests.support.remediator_process import AUTH, Remediator

PY = sys.executable
CTL = [PY, "-m", "llm_health.simulator.ctl"]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    s = Simulator(SimConfig(port=free_port(), control_port=free_port(), model="gpu-a", restart_seconds=0.2)).start()
    wait_until(lambda: requests.get(s.url + "/health", timeout=1).ok, what="simulator")
    yield s
    s.stop()


def start(tmp_path: Path, sim: Simulator, headroom_wait: float) -> Remediator:
    free, checks, stops = tmp_path / "gpu-free", tmp_path / "checks", tmp_path / "stops"
    data: dict[str, Any] = {
        "backends": [{"name": "gpu-a", "url": sim.url, "model": "gpu-a",
                      "stop": [PY, "-c", f"open({str(stops)!r}, 'a').write('stop\\n')"],
                      "headroom": [PY, "-c", f"import os, sys; open({str(checks)!r}, 'a').write('x\\n'); "
                                   f"sys.exit(0 if os.path.exists({str(free)!r}) else 1)"],
                      "start": [*CTL, "restart", sim.control_url]}],
        "remediator": {"verify_readings": 2, "verify_interval": 0.2, "warmup_poll": 0.2, "warmup_timeout": 30,
                       "action_timeout": 60, "headroom_wait": headroom_wait, "headroom_poll": 0.2,
                       "headroom_timeout": 5},
    }
    rem = Remediator(tmp_path, data).wait_ready()
    wait_until(lambda: rem.get("/api/backends").json()["backends"][0]["lifecycle"]["state"] == "ready", timeout=60,
               what="gpu-a READY")
    return rem


def events(rem: Remediator, kind: str) -> list[dict[str, Any]]:
    return rem.get("/api/events", params={"backend": "gpu-a", "kind": kind}).json()["events"]


def test_the_start_waits_for_headroom_then_the_backend_is_ready_again(tmp_path: Path, sim: Simulator) -> None:
    rem = start(tmp_path, sim, headroom_wait=60)
    try:
        sim.set_fault("crash")                       # down: verified down, restarted at once
        assert rem.post("/webhook", payload(alert("gpu-a", alertname="LLMBackendDown"))).status_code == 202
        checks = tmp_path / "checks"
        wait_until(lambda: checks.exists() and len(checks.read_text().split()) >= 3, timeout=30,
                   what="stopped, three headroom checks failed")
        assert (tmp_path / "stops").read_text().split() == ["stop"]
        assert sim.stats_json()["restarts"] == 0     # not started while there is no headroom
        (tmp_path / "gpu-free").write_text("")       # the old process let go of the memory
        wait_until(lambda: events(rem, "recovered"), timeout=60, what="warm and READY again")
        assert sim.stats_json()["restarts"] == 1
    finally:
        rem.stop()


def test_headroom_that_never_passes_leaves_the_host_to_a_person(tmp_path: Path, sim: Simulator) -> None:
    rem = start(tmp_path, sim, headroom_wait=1)
    try:
        sim.set_fault("crash")
        assert rem.post("/webhook", payload(alert("gpu-a", alertname="LLMBackendDown"))).status_code == 202
        wait_until(lambda: events(rem, "no_headroom"), timeout=60, what="no headroom")
        b = rem.get("/api/backends").json()["backends"][0]
        assert b["lifecycle"]["state"] == "error" and "host needs attention" in b["lifecycle"]["reason"]
        assert b["incident"]["state"] == "needs_ack"
        assert events(rem, "escalated")
        metrics = rem.get("/metrics").text
        assert 'llm_health_remediator_host_needs_attention{backend="gpu-a"} 1.0' in metrics
        assert sim.stats_json()["restarts"] == 0
        out = requests.get(rem.url + "/api/events", params={"backend": "gpu-a", "kind": "no_headroom"},
                           headers=AUTH, timeout=5).json()["events"][0]
        assert "HEADROOM NEVER PASSED" in out["detail"]["output"]
    finally:
        rem.stop()
