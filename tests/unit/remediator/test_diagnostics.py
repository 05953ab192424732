"""Diagnostics before a kill: the bounded capture (remediator/diagnostics.py), when the authority runs it
(restart/capture.py) and where its output goes (the store, the API, ctl)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from llm_health.remediator.diagnostics import capture
from llm_health.remediator.store import CaptureResult
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

PY = sys.executable


def test_a_capture_keeps_its_output_and_exit_code() -> None:
    got = capture([PY, "-c", "import os, sys; print(os.environ['LLM_HEALTH_BACKEND']); sys.exit(3)"],
                  {"LLM_HEALTH_BACKEND": "gpu-a"}, 10, 1000)
    assert (got.result, got.exit_code, got.output.strip()) == (CaptureResult.FAILED, 3, "gpu-a")


def test_a_capture_that_hangs_is_killed_at_its_bound_and_keeps_what_it_wrote() -> None:
    started = time.monotonic()
    got = capture([PY, "-c", "import time; print('stacks so far', flush=True); time.sleep(60)"], {}, 1.0, 1000)
    assert time.monotonic() - started < 10
    assert got.result == CaptureResult.TIMEOUT and got.exit_code is None
    assert "stacks so far" in got.output and "killed after 1s" in got.output


def test_a_capture_is_cut_at_its_size_and_says_so() -> None:
    got = capture([PY, "-c", "print('x' * 100000)"], {}, 10, 500)
    assert got.truncated and got.output.split("\n")[0] == "x" * 500 and "cut at 500 bytes" in got.output


def test_a_capture_that_cannot_start_says_why() -> None:
    got = capture(["/nonexistent/py-spy"], {}, 5, 100)
    assert got.result == CaptureResult.FAILED and "could not start" in got.output


def stalled_world(tmp_path: Path, argv: list[str], **settings: object) -> World:
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), min_ready=1, diagnostics=argv, **settings)
    w.work["gpu-a"] = 0        # nothing in flight: the drain ends at once
    return w


def test_a_stalled_backend_is_captured_right_before_its_restart(tmp_path: Path) -> None:
    w = stalled_world(tmp_path, [PY, "-c", "import os; print('MainThread stack of', os.environ['LLM_HEALTH_URL'])"])
    w.deliver(payload(alert("gpu-a")))
    w.run_until(lambda: w.restarted == ["gpu-a"], "restarted")
    kinds = w.kinds("gpu-a")
    assert kinds.index("diagnostics") < kinds.index("restarted")
    got = w.store.latest_capture("gpu-a")
    assert got is not None and got.result == CaptureResult.OK and "MainThread stack of http://127.0.0.1:18100" in got.output
    assert got.incident_id == w.last_incident("gpu-a")["id"]
    shown = w.client.get("/api/backends/gpu-a/diagnostics", headers=AUTH).get_json()
    assert "MainThread stack" in shown["output"]
    hidden = w.client.get("/api/backends/gpu-a/diagnostics").get_json()
    assert "MainThread" not in hidden["output"]
    view = next(b for b in w.client.get("/api/backends").get_json()["backends"] if b["backend"] == "gpu-a")
    assert view["diagnostics"]["result"] == "ok"
    assert "diagnostics #" in w.client.get("/").get_data(as_text=True)


def test_a_capture_that_times_out_never_holds_the_restart_past_its_bound(tmp_path: Path) -> None:
    w = stalled_world(tmp_path, [PY, "-c", "import time; time.sleep(60)"], diagnostics_timeout=1)
    started = time.monotonic()
    w.deliver(payload(alert("gpu-a")))
    w.run_until(lambda: w.restarted == ["gpu-a"], "restarted")
    assert time.monotonic() - started < 15
    got = w.store.latest_capture("gpu-a")
    assert got is not None and got.result == CaptureResult.TIMEOUT
    assert "timed out" in w.events("gpu-a", "diagnostics")[0].reason


def test_no_capture_for_a_backend_that_is_down_or_a_restart_asked_for(tmp_path: Path) -> None:
    w = stalled_world(tmp_path, [PY, "-c", "print('x')"])
    w.outcomes["gpu-b"] = "down"
    w.deliver(payload(alert("gpu-b", alertname="LLMBackendDown")))
    w.run_until(lambda: w.restarted == ["gpu-b"], "gpu-b restarted")
    assert w.client.post("/api/backends/gpu-c/restart", json={"by": "ops", "reason": "upgrade"},
                         headers=AUTH).status_code == 200
    w.work["gpu-c"] = 0
    w.run_until(lambda: "gpu-c" in w.restarted, "gpu-c restarted")
    assert w.store.latest_capture("gpu-b") is None and w.store.latest_capture("gpu-c") is None


def test_a_backend_may_turn_the_capture_off(tmp_path: Path) -> None:
    w = stalled_world(tmp_path, [PY, "-c", "print('x')"])
    import dataclasses
    w.config = dataclasses.replace(w.config, backends=tuple(dataclasses.replace(b, diagnostics=())
                                                            if b.name == "gpu-a" else b for b in w.config.backends))
    w.authority.ctx.config = w.config
    w.deliver(payload(alert("gpu-a")))
    w.run_until(lambda: w.restarted == ["gpu-a"], "restarted")
    assert w.store.latest_capture("gpu-a") is None
