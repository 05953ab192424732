"""Acceptance for issue 22, "Kubernetes traffic follows the lifecycle": `llm-health readiness` as a real
process beside a simulated vLLM, polling a real remediator (gunicorn).

Its /ready is 200 once the remediator has the backend READY and in service, 503 while a restart
asked for by hand (`llm-health ctl restart`) drains, restarts and warms it up; an operator's drain
(`llm-health ctl drain`) turns it 503 within a few polls and undrain turns it back; with the remediator
stopped, its last answer holds for --fallback-after seconds and then the engine's own /health decides
(200 while the simulator serves, 503 once it crashed). Every wait polls with a deadline.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.remediator_process import Remediator

NAME = "vllm-0"
INTERVAL = 0.2
FALLBACK_AFTER = 3.0
FEW_POLLS = 10 * INTERVAL + 3.0       # a few polls, and room for a busy machine


@pytest.fixture
def sim() -> Iterator[Simulator]:
    s = Simulator(SimConfig(port=free_port(), control_port=free_port(), model=NAME, step_seconds=0.005,
                            restart_seconds=0.2)).start()
    try:
        wait_until(lambda: requests.get(s.url + "/health", timeout=1).ok, what="simulator up")
        yield s
    finally:
        s.stop()


def ready(url: str) -> tuple[int, str]:
    r = requests.get(url + "/ready", timeout=2)
    return r.status_code, r.text


def until(url: str, status: int, needle: str, what: str, timeout: float = FEW_POLLS) -> str:
    """Poll the sidecar's /ready until it answers `status` with `needle` in the body; the body."""
    seen: list[tuple[int, str]] = []

    def check() -> str | None:
        got = ready(url)
        seen[:] = [got]
        return got[1] if got[0] == status and needle in got[1] else None

    try:
        return wait_until(check, timeout=timeout, interval=0.05, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last /ready: {seen}") from None


def ctl(r: Remediator, command: str) -> None:
    done = subprocess.run(llm_health("ctl", "--remediator", r.url, "--token-file", r.workdir / "token", command,
                                     NAME, "--reason", "kernel upgrade", "--by", "ops@test"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ready_follows_drain_undrain_and_falls_back_to_the_engine(tmp_path: Path, sim: Simulator) -> None:
    r = Remediator(tmp_path, {"backends": [{"name": NAME, "url": sim.url, "model": NAME,
                                            "restart": ["sleep", "2"]}],
                              "remediator": {"warmup_poll": 0.2, "verify_interval": 0.2, "verify_readings": 2}})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sidecar = ManagedProcess(llm_health("readiness", "--remediator", r.url, "--engine-url", sim.url,
                                        "--listen", f"127.0.0.1:{port}", "--interval", INTERVAL, "--timeout", 1,
                                        "--engine-timeout", 1, "--fallback-after", FALLBACK_AFTER),
                             name="readiness", log_dir=tmp_path, env={"POD_NAME": NAME})   # the downward API's
    try:
        sidecar.wait_http(url + "/healthz")
        r.wait_ready()
        body = until(url, 200, "remediator: ready and in service", "READY after the remediator's first look",
                     timeout=30)
        assert "lifecycle ready, admin in_service" in body

        ctl(r, "restart")                    # drain, the action (2 s), warm-up: out until READY again
        body = until(url, 503, "remediator: not ready:", "out while the restart runs")
        assert "admin in_service" in body and "lifecycle ready" not in body
        until(url, 200, "remediator: ready and in service", "in again after the warm-up gate")

        ctl(r, "drain")
        body = until(url, 503, "drained by ops@test: kernel upgrade", "not ready after the drain")
        assert body.startswith("not ready: remediator: not ready:") and "admin drained" in body
        ctl(r, "undrain")
        until(url, 200, "remediator: ready", "ready again after undrain")

        ctl(r, "drain")
        until(url, 503, "admin drained", "drained again")
        stopping = time.monotonic()          # its last answer came at most a poll before
        r.stop()
        # the drained answer holds through the outage until it is --fallback-after old ...
        until(url, 503, "latest poll failed (the remediator did not answer: refused", "the answer held")
        # ... then the engine's own /health decides: the simulator serves
        body = until(url, 200, "fallback: no answer from the remediator", "the engine's /health decides")
        assert time.monotonic() - stopping >= FALLBACK_AFTER - 2 * INTERVAL and "the engine's /health: HTTP 200" in body
        sim.set_fault("crash")
        until(url, 503, "the engine's /health: refused", "a crashed engine is not ready")
        sim.set_fault("none")                                   # back up: ready on its /health again
        until(url, 200, "the engine's /health: HTTP 200", "the engine serves again")
        log = sidecar.log()
        assert log.count("not ready: remediator: not ready: drained") == 2     # one line per change
        assert log.count("ready: remediator: ready and in service") == 3
        assert "ready: fallback:" in log and "Traceback" not in log
    finally:
        sidecar.stop()
        r.stop()
