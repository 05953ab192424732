"""`llm-health diagnose`, the shipped recipe, against a real simulated vLLM and a process to dump; py-spy is
stood in for by a script that answers as py-spy does without SYS_PTRACE."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from llm_health.drill.procs import free_port, llm_health, wait_until
from llm_health.simulator.server import SimConfig, Simulator

EPERM_PY_SPY = """#!/bin/sh
echo "Permission Denied: Try running again with elevated permissions by going 'sudo env \\"PATH=$PATH\\" !!'" >&2
echo "Error: Operation not permitted (os error 1)" >&2
exit 1
"""


@pytest.fixture
def sim() -> Iterator[Simulator]:
    s = Simulator(SimConfig(port=free_port())).start()
    wait_until(lambda: requests.get(s.url + "/health", timeout=1).ok, what="simulator")
    yield s
    s.stop()


def test_diagnose_shows_health_pages_stacks_and_says_how_to_grant_ptrace(sim: Simulator, tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text(EPERM_PY_SPY)
    fake.chmod(0o755)
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # diag-target-engine"])
    try:
        done = subprocess.run(
            llm_health("diagnose", "--url", sim.url, "--out", tmp_path, "--match", "diag-target-engine",
                       "--py-spy", fake, "--timeout", "5", "--log-command", sys.executable, "-c", "print('last log line')"),
            capture_output=True, text=True, timeout=60,
        )
    finally:
        target.kill()
        target.wait()
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "=== /health" in out and "HTTP 200" in out
    assert out.count("=== /metrics page") == 2 and "vllm:num_requests_running" in out
    assert (tmp_path / "metrics-1.txt").read_text().startswith("#") and (tmp_path / "metrics-2.txt").exists()
    assert f"--- pid {target.pid}" in out and "Operation not permitted" in out
    assert "SYS_PTRACE" in out and "shareProcessNamespace" in out
    assert "last log line" in out


def test_diagnose_of_a_server_that_is_gone_still_answers(tmp_path: Path) -> None:
    done = subprocess.run(llm_health("diagnose", "--url", f"http://127.0.0.1:{free_port()}", "--match", "no-such-xyz",
                                     "--py-spy", ""), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "no answer: refused" in done.stdout and "0 process(es)" in done.stdout
