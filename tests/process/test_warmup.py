"""Acceptance for the warm-up gate (issue 7): after a restart the backend is READY only when /health
answers, /v1/models lists the model *and* a one-token request succeeds; until then it stays INITIALIZING,
bounded by warmup_timeout, after which it is ERROR and escalated - and not restarted in a loop.

A real `llm-health remediator` process and an in-process simulator. The backend's restart action is a
small Python script (argv, no shell) that restarts the simulator through its control port, waits until the
main port answers, then injects the `error` fault: /health and /v1/models are fine afterwards, but every
generation request (the warm-up's one-token probe included) fails with HTTP 500.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.alerts import alert, payload
from tests.support.paths import REPO
from tests.support.remediator_process import TOKEN, RemediatorRig, stop_rig

NAME = "gpu-a"
WARMUP_TIMEOUT = 4.0

pytestmark = pytest.mark.e2e

RESTART_THEN_FAIL = '''
import subprocess, sys, time
import requests
log, ctl, main = sys.argv[1], sys.argv[2], sys.argv[3]
with open(log, "a") as f:
    f.write(f"start gpu-a {time.time():.6f}\\n")
code = subprocess.call([sys.executable, "-m", "llm_health.simulator.ctl", "restart", ctl], stdout=subprocess.DEVNULL)
deadline = time.monotonic() + 15
while True:
    try:
        if requests.get(main + "/health", timeout=1).status_code == 200:
            break
    except requests.RequestException:
        pass
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
code = code or subprocess.call([sys.executable, "-m", "llm_health.simulator.ctl", "fault", "error", ctl],
                               stdout=subprocess.DEVNULL)
with open(log, "a") as f:
    f.write(f"end gpu-a {time.time():.6f}\\n")
sys.exit(code)
'''


def build(tmp: Path, warmup_timeout: float) -> RemediatorRig:
    sim = Simulator(SimConfig(port=free_port(), control_port=free_port(), model=NAME,
                              restart_seconds=0.3, step_seconds=0.005)).start()
    proc = None
    try:
        wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
        (tmp / "token").write_text(TOKEN)
        (tmp / "restart.py").write_text(RESTART_THEN_FAIL)
        port = free_port()
        cfg = {
            "backends": [{"name": NAME, "url": sim.url, "host": "node-1", "model": NAME,
                          "restart": [sys.executable, str(tmp / "restart.py"), str(tmp / "actions.txt"),
                                      str(sim.control_url), sim.url]}],
            "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
            "remediator": {
                "listen": f"127.0.0.1:{port}", "state": "state.db", "token_file": "token", "workers": 1,
                "verify_readings": 2, "verify_interval": 0.2, "poll_interval": 0.1, "warmup_poll": 0.2,
                "warmup_timeout": warmup_timeout, "action_timeout": 20, "drain_timeout": 20,
                "stalled_drain_timeout": 0.3, "dedup_window": 60,
            },
        }
        (tmp / "llm-health.yml").write_text(yaml.safe_dump(cfg))
        proc = ManagedProcess(llm_health("remediator", "--config", tmp / "llm-health.yml"), name="remediator",
                              log_dir=tmp, cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/healthz", timeout=30)
        rig = RemediatorRig(url, tmp, proc, {NAME: sim}, agent_port=0)
        rig.wait(lambda: rig.lifecycle() == {NAME: "ready"}, "the backend READY at start-up")
        rig.mark = max(e["id"] for e in rig.events())
        return rig
    except BaseException:
        if proc is not None:
            proc.stop()
        sim.stop()
        raise


@pytest.fixture
def short_warmup(tmp_path: Path) -> Iterator[RemediatorRig]:
    rig = build(tmp_path, WARMUP_TIMEOUT)
    yield rig
    stop_rig(rig)


@pytest.fixture
def long_warmup(tmp_path: Path) -> Iterator[RemediatorRig]:
    rig = build(tmp_path, 15.0)
    yield rig
    stop_rig(rig)


def restart_via_stall_alert(rig: RemediatorRig) -> tuple[int, int]:
    """Stall the simulator with work in flight and post the stall alert: the authority verifies
    no_progress, drains, runs the restart action. Returns (restarts, probes) seen before."""
    sim = rig.sims[NAME]
    before = sim.stats_json()
    rig.stall_with_work(NAME)
    rig.post(payload(alert(NAME)))
    rig.wait(lambda: [k for k, *_ in rig.actions()] == ["start", "end"], "the restart action ran")
    assert sim.stats_json()["restarts"] == before["restarts"] + 1
    return before["restarts"], before["probes"]


def one_token(url: str) -> requests.Response:
    return requests.post(url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 1}, timeout=5)


def states_until(rig: RemediatorRig, done: Any, what: str, timeout: float) -> list[str]:
    """Poll the lifecycle state until done(state); every distinct state seen, in order."""
    seen: list[str] = []

    def look() -> bool:
        st = rig.lifecycle()[NAME]
        if not seen or seen[-1] != st:
            seen.append(st)
        return bool(done(st))

    rig.wait(look, what, timeout=timeout)
    return seen


def lifecycle_steps(rig: RemediatorRig) -> list[tuple[str, str]]:
    return [(e["detail"]["source"], e["detail"]["target"]) for e in rig.events(NAME, "lifecycle")]


def test_failing_generation_keeps_it_initializing_then_error_escalated_no_restart_loop(short_warmup: RemediatorRig) -> None:
    rig, sim = short_warmup, short_warmup.sims[NAME]
    restarts, probes = restart_via_stall_alert(rig)
    # the restarted backend looks fine on the cheap endpoints, but cannot answer a single token
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    assert requests.get(sim.url + "/v1/models", timeout=5).json()["data"][0]["id"] == NAME
    assert one_token(sim.url).status_code == 500

    seen = states_until(rig, lambda st: st == "error", "gpu-a ERROR after warmup_timeout",
                        timeout=WARMUP_TIMEOUT + 15)
    assert "ready" not in seen, f"became READY while every generation request failed: {seen}"
    assert "initializing" in seen, seen
    assert lifecycle_steps(rig) == [("ready", "draining"), ("draining", "stopped"), ("stopped", "initializing"),
                                    ("initializing", "error")]
    events = rig.events(NAME)
    kinds = [e["kind"] for e in events]
    restarted = next(e for e in events if e["kind"] == "restarted")
    to_error = next(e for e in events if e["kind"] == "lifecycle" and e["detail"]["target"] == "error")
    assert to_error["at"] >= restarted["at"] + WARMUP_TIMEOUT, (restarted, to_error)   # bounded, not sooner
    assert "warmup_timeout" in kinds and "escalated" in kinds, kinds
    assert kinds.index("restarted") < kinds.index("warmup_timeout") < kinds.index("escalated"), kinds
    escalated = next(e for e in events if e["kind"] == "escalated")
    assert "warm-up timeout" in escalated["reason"], escalated
    assert "recovered" not in kinds and "ready" not in [e["detail"]["target"] for e in events
                                                        if e["kind"] == "lifecycle"]
    # the warm-up did send one-token probes (they failed): not a READY on /health + /v1/models alone
    assert sim.stats_json()["probes"] > probes

    # no restart loop: the alert keeps firing (Alertmanager repeats it) and the authority keeps looking at the
    # backend (its one-token probes keep failing), yet it stays ERROR and the action has run exactly once
    rig.post(payload(alert(NAME)))
    looked = sim.stats_json()["probes"]

    looks: list[tuple[str, int, int, str]] = []     # (lifecycle, actions run, restarts, fault) at each look

    def several_more_looks() -> bool:
        st = sim.stats_json()
        looks.append((rig.lifecycle()[NAME], len(rig.actions()), st["restarts"], st["fault"]))
        return bool(st["probes"] >= looked + 6)

    rig.wait(several_more_looks, "six more warm-up probes to fail", timeout=20)
    assert len(looks) > 1 and set(looks) == {("error", 2, restarts + 1, "error")}, looks
    kinds = [e["kind"] for e in rig.events(NAME)]
    assert kinds.count("restarting") <= 1 and kinds.count("restarted") == 1, kinds
    assert kinds.count("escalated") == 1, kinds


def test_clearing_the_error_before_the_timeout_lets_it_become_ready(long_warmup: RemediatorRig) -> None:
    rig, sim = long_warmup, long_warmup.sims[NAME]
    _, probes = restart_via_stall_alert(rig)
    rig.wait(lambda: rig.lifecycle()[NAME] == "initializing", "gpu-a INITIALIZING after the action")
    rig.wait(lambda: sim.stats_json()["probes"] > probes, "a warm-up probe failed")
    assert one_token(sim.url).status_code == 500
    assert rig.lifecycle()[NAME] == "initializing"          # failing probes: still not READY
    failed_probes = sim.stats_json()["probes"]
    sim.set_fault("none")
    seen = states_until(rig, lambda st: st == "ready", "gpu-a READY once a token comes back", timeout=15)
    assert seen[0] == "initializing" and "error" not in seen, seen
    assert lifecycle_steps(rig) == [("ready", "draining"), ("draining", "stopped"), ("stopped", "initializing"),
                                    ("initializing", "ready")]
    kinds = [e["kind"] for e in rig.events(NAME)]
    assert "recovered" in kinds and "escalated" not in kinds and "warmup_timeout" not in kinds, kinds
    assert sim.stats_json()["probes"] > failed_probes         # READY came from a probe that succeeded
    assert [k for k, *_ in rig.actions()] == ["start", "end"]
