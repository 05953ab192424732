"""Operator commands end to end: `llm-health ctl` against a real remediator (gunicorn, 2 workers), its agent
answering a real HAProxy 2.6 (agent-inter 200 ms) in front of two simulators, and alerts through a real
Alertmanager with the shipped configuration."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import llm_health
from tests.support.alertmanager import AM_BINARY, running_alertmanager
from tests.support.alerts import alert, payload
from tests.support.lifecycle_rig import HAPROXY, build_rig
from tests.support.paths import REPO
from tests.support.remediator_process import RemediatorRig, stop_rig

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(HAPROXY is None or AM_BINARY is None,
                                                  reason="haproxy or prometheus-alertmanager not installed")]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[RemediatorRig]:
    rig = build_rig(tmp_path, {"gpu-a": "node-1", "gpu-b": "node-2"}, lb=True, min_ready=1)
    yield rig
    stop_rig(rig)


def ctl(rig: RemediatorRig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(llm_health("ctl", "--remediator", rig.url, "--token-file", rig.tmp / "token", *args),
                          capture_output=True, text=True, timeout=60)


def holds(rig: RemediatorRig, check: object, seconds: float) -> None:
    """`check()` stays true for `seconds` (many agent checks at 200 ms), looked at every 50 ms."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), rig.stats()        # type: ignore[operator]
        time.sleep(0.05)


def test_drain_stays_drained_across_agent_checks_until_undrained(rig: RemediatorRig) -> None:
    done = ctl(rig, "drain", "gpu-a", "--reason", "kernel upgrade", "--by", "ops@node-1")
    assert done.returncode == 0, done.stderr
    assert "drain: changed" in done.stdout
    rig.wait(lambda: rig.stats()["gpu-a"].draining, "HAProxy drains gpu-a")
    holds(rig, lambda: rig.stats()["gpu-a"].draining, 2.0)          # ten agent checks: never undone
    assert {rig.served_by() for _ in range(6)} == {"gpu-b"}
    status = ctl(rig, "status")
    line = next(ln for ln in status.stdout.splitlines() if ln.startswith("gpu-a"))
    assert "ready" in line and "drained" in line and "ops@node-1" in line and "kernel upgrade" in line
    refused = ctl(rig, "drain", "gpu-b", "--reason", "too")
    assert refused.returncode == 1 and "min_ready" in refused.stderr
    assert rig.stats()["gpu-b"].up
    assert ctl(rig, "undrain", "gpu-a", "--reason", "done").returncode == 0
    rig.wait(lambda: rig.stats()["gpu-a"].up and not rig.stats()["gpu-a"].draining, "gpu-a UP again")
    events = [e["kind"] for e in rig.events("gpu-a")]
    assert events.count("operator_drain") == 1 and events.count("operator_undrain") == 1
    assert [e["kind"] for e in rig.events("gpu-b")].count("operator_refused") == 1


def alertmanager_config(rig: RemediatorRig) -> Path:
    """deploy/alertmanager/alertmanager.yml, its webhooks pointed at this remediator, its waits shortened."""
    config = yaml.safe_load((REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())

    def shorten(route: dict[str, Any]) -> None:
        route.update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1m"})
        for child in route.get("routes") or []:
            shorten(child)

    shorten(config["route"])
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs") or []:
            hook["url"] = f"{rig.url}/webhook"
            hook["http_config"]["authorization"]["credentials_file"] = str(rig.tmp / "token")
    path = rig.tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def fire(am_url: str, backend: str, *alertnames: str) -> None:
    body = [{"labels": {"alertname": name, "backend": backend, "severity": "critical", "remediation": "restart"},
             "annotations": {"summary": f"{name} {backend}"}} for name in alertnames]
    requests.post(f"{am_url}/api/v2/alerts", json=body, timeout=5).raise_for_status()


def test_a_retired_backend_stays_out_whatever_the_alerts_say(rig: RemediatorRig) -> None:
    assert ctl(rig, "retire", "gpu-b", "--reason", "bad GPU").returncode == 0
    rig.wait(lambda: rig.stats()["gpu-b"].status.startswith("MAINT"), "HAProxy puts gpu-b in MAINT")
    rig.sims["gpu-b"].set_fault("stall")
    with running_alertmanager(alertmanager_config(rig), rig.tmp) as am_url:
        fire(am_url, "gpu-b", "LLMBackendStalled", "LLMBackendDown")
        rig.wait(lambda: any(e["kind"] == "retired_ignored" for e in rig.events("gpu-b")), "the alerts ignored",
                 timeout=60)
    holds(rig, lambda: rig.stats()["gpu-b"].status.startswith("MAINT"), 1.0)
    assert rig.actions() == [] and rig.sims["gpu-b"].stats_json()["restarts"] == 0
    assert rig.lifecycle()["gpu-b"] == "ready"        # its lifecycle is untouched: nothing decided about it
    rig.sims["gpu-b"].set_fault("none")
    assert ctl(rig, "activate", "gpu-b", "--reason", "GPU replaced").returncode == 0
    rig.wait(lambda: rig.stats()["gpu-b"].up, "gpu-b UP again")
    unknown = ctl(rig, "drain", "nope", "--reason", "x")
    assert unknown.returncode == 2 and "unknown backend" in unknown.stderr


def test_a_restart_asked_for_through_ctl_drains_restarts_and_comes_back(rig: RemediatorRig) -> None:
    done = ctl(rig, "restart", "gpu-a", "--reason", "vLLM upgrade", "--by", "ops@node-1")
    assert done.returncode == 0 and "incident" in done.stdout, done.stderr
    rig.wait(lambda: rig.sims["gpu-a"].stats_json()["restarts"] == 1, "gpu-a restarted", timeout=60)
    rig.wait(lambda: rig.lifecycle()["gpu-a"] == "ready" and rig.stats()["gpu-a"].up, "gpu-a READY and UP again",
             timeout=60)
    kinds = [e["kind"] for e in rig.events("gpu-a")]
    assert kinds.index("operator_restart") < kinds.index("draining") < kinds.index("restarting") < kinds.index(
        "recovered")
    assert [a[:2] for a in rig.actions()] == [("start", "gpu-a"), ("end", "gpu-a")]
    again = ctl(rig, "status", "gpu-a")
    assert again.returncode == 0 and "ready" in again.stdout


def test_ctl_diagnostics_shows_what_was_captured_before_the_kill(tmp_path: Path) -> None:
    import sys
    capture = [sys.executable, "-c", "import os; print('Thread EngineCore (idle): stack of', os.environ['LLM_HEALTH_BACKEND'])"]
    rig = build_rig(tmp_path, {"gpu-a": "node-1", "gpu-b": "node-2"}, lb=False, min_ready=1, diagnostics=capture)
    try:
        rig.stall_with_work("gpu-a")
        rig.post(payload(alert("gpu-a")))
        rig.wait(lambda: any(e["kind"] == "recovered" for e in rig.events("gpu-a")), "restarted and warm", timeout=60)
        shown = ctl(rig, "diagnostics", "gpu-a")
        assert shown.returncode == 0, shown.stderr
        assert "diagnostics #1 of gpu-a" in shown.stdout and ": ok in" in shown.stdout
        assert "Thread EngineCore (idle): stack of gpu-a" in shown.stdout
        status = ctl(rig, "status", "gpu-a")
        assert "diag:ok" in status.stdout
        kinds = [e["kind"] for e in rig.events("gpu-a")]
        assert kinds.index("diagnostics") < kinds.index("restarted")
    finally:
        stop_rig(rig)
