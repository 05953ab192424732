"""`make demo ARGS=--once`: the demo runs the fire drill for real and exits with its verdict."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llm_health.drill.procs import llm_health, port_open

pytestmark = pytest.mark.e2e


def test_demo_once_runs_the_drill_and_reports(tmp_path: Path) -> None:
    done = subprocess.run(
        llm_health("demo", "--once", "--workdir", tmp_path / "demo", "--timeout", "120"),
        capture_output=True, text=True, timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    # narrated as it happened: verdict, alert, decision, restart, recovery, in that order
    milestones = [
        "sim-a: stalled",
        "LLMBackendStalled firing for sim-a",
        "incident_opened sim-a",
        "restarted sim-a",
        "recovered sim-a",
        "summary:",
    ]
    positions = [out.find(m) for m in milestones]
    assert all(p >= 0 for p in positions), f"missing milestones in:\n{out}"
    assert positions == sorted(positions), f"milestones out of order:\n{out}"
    assert "sim-a restarted 1 time(s) by the remediator (simulator counted 1)" in out
    assert "busy backend sim-b: 0 restarts, 0 probes sent to it during the drill" in out
    assert "probes that reached sim-b while it was busy (once the exporter had seen its work): 0" in out
    assert "remediator status page: http://127.0.0.1:" in out
    # every process the demo started is gone: the URLs it printed no longer answer
    for line in out.splitlines():
        if line.startswith(("remediator status page:", "Prometheus:")):
            host_port = line.split("http://", 1)[1].split("/", 1)[0]
            host, port = host_port.rsplit(":", 1)
            assert not port_open(host, int(port)), f"{line} still answers after the demo exited"
