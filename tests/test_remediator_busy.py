"""`llm-health busy` as a real process: marker file set while the job runs, removed after, exit code kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from llm_health.procs import ManagedProcess, free_port, llm_health, wait_until


def write_config(tmp_path: Path, busy_dir: bool = True, name: str = "llm-health.yml") -> Path:
    cfg = {"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18001"}],
           "remediator": {"busy_dir": "busy"} if busy_dir else {}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_file_marker_lives_as_long_as_the_job(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    go = tmp_path / "go"
    job = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nsys.exit(7)"
    proc = ManagedProcess(llm_health("busy", "--backend", "gpu-a", "--ttl", "0.6", "--config", config, "--",
                                     sys.executable, "-c", job), name="busy", log_dir=tmp_path)
    try:
        busy = tmp_path / "busy"
        markers = wait_until(lambda: list(busy.glob("gpu-a@*")), what="marker file")
        assert markers[0].read_text().strip() == "ttl=0.6"
        first = markers[0].stat().st_mtime
        wait_until(lambda: markers[0].stat().st_mtime > first, timeout=5, what="marker refreshed")
        go.write_text("")
        assert proc.proc.wait(timeout=10) == 7
        assert list(busy.glob("gpu-a*")) == []
    finally:
        proc.stop()


def test_refuses_when_the_marker_cannot_be_set(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    job = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    cases = [
        ["--config", write_config(tmp_path, busy_dir=False, name="no-busy.yml")],                       # no busy_dir
        ["--config", write_config(tmp_path), "--backend", "nope"],                   # unknown backend
        ["--remediator", f"http://127.0.0.1:{free_port()}"],                        # unreachable remediator
    ]
    for extra in cases:
        argv = llm_health("busy", "--backend", "gpu-a", *extra, "--", *job)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, done.stderr
        assert "llm-health busy:" in done.stderr
    assert not ran.exists()                                                          # never ran unprotected
