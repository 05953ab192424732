"""The whole pipeline with a real vLLM 0.32 (CPU): exporter + Prometheus (our rules) + Alertmanager +
remediator, which restarts the real server through a restart script, then warms it up to READY.

The server is started (and restarted) by `python tests/support/real_engines.py restart STATE_DIR`, the
backend's restart command: SIGTERM to the old server's process group (SIGKILL after 10 s), a new
server in the background. The stall is real: SIGSTOP of the EngineCore with requests in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_health.drill.procs import free_port
from llm_health.drill.stack import ExternalBackend, Stack, Timings
from llm_health.exporter.reading import read_text
from tests.support.paths import TESTS
from tests.support.real_engines import (
    MODEL_NAME,
    Load,
    engine_core,
    get,
    metrics_text,
    require_engine,
    vllm_engine,
    wait_for,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

SCRIPT = TESTS / "support" / "real_engines.py"
START_TIMEOUT = 180


def _server_pid(state: Path) -> int:
    return int(json.loads((state / "server.json").read_text())["pid"])


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def test_real_stall_is_alerted_verified_restarted_and_warmed_up(tmp_path: Path) -> None:
    paths = require_engine("vllm")
    state = tmp_path / "vllm"
    state.mkdir()
    engine = vllm_engine(paths, free_port(), state)
    (state / "server.json").write_text(json.dumps({"argv": engine.argv, "env": engine.env, "pid": 0, "starts": 0}))
    restart = (sys.executable, str(SCRIPT), "restart", str(state))
    subprocess.run(restart, check=True, capture_output=True, timeout=60)
    pids = [_server_pid(state)]
    try:
        wait_for(lambda: get(engine.url, "/health", 1.0)[0] == 200, START_TIMEOUT, "vLLM ready", 0.5)
        old = read_text(metrics_text(engine.url) or "")
        backend = ExternalBackend("vllm-real", engine.url, MODEL_NAME, restart)
        timings = Timings(warmup_timeout=START_TIMEOUT, stall_after=5.0, read_timeout=2.0, probe_timeout=5.0)
        with Stack(tmp_path / "stack", backends=(), external=(backend,), timings=timings) as stack:
            load = Load(engine.url, 4, 700, hold=True)
            stack.wait(lambda: stack.verdicts()["vllm-real"]["verdict"] == "busy", 30, "judged busy")
            load.stop()  # each client's completion in flight now is its last: frozen, then cut off
            os.kill(engine_core(pids[0]), signal.SIGSTOP)
            t0 = time.monotonic()
            stack.wait(lambda: stack.verdicts()["vllm-real"]["verdict"] == "stalled", 30, "judged stalled")
            stalled_after = time.monotonic() - t0
            stack.wait(lambda: stack.firing("LLMBackendStalled", "vllm-real"), 30, "stall alert firing")
            stack.wait(lambda: "restarted" in [e["kind"] for e in stack.events("vllm-real")], 60,
                       "the remediator restarted it")
            pids.append(_server_pid(state))
            assert pids[-1] != pids[0]
            stack.wait(lambda: "recovered" in [e["kind"] for e in stack.events("vllm-real")], START_TIMEOUT + 30,
                       "warmed up to READY")
            recovered_after = time.monotonic() - t0
            new = read_text(metrics_text(engine.url) or "")
            assert new.process_start is not None and new.process_start != old.process_start
            assert any(new.created.get(k) not in (None, v) for k, v in old.created.items())
            stack.wait(lambda: stack.verdicts()["vllm-real"]["verdict"] in ("idle", "restarted"), 30,
                       "the new server judged")
            kinds = [e["kind"] for e in stack.events("vllm-real")]
            assert kinds.count("restarted") == 1, kinds
            load.wait(60)  # the frozen requests were cut off by the restart
            assert 200 not in load.last(), load.per_client
            print(f"\nreal vLLM pipeline: stalled {stalled_after:.1f} s after SIGSTOP, recovered (READY) "
                  f"{recovered_after:.1f} s after it")
    finally:
        for pid in pids:
            _kill_group(pid)
