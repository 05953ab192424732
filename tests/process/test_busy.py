"""`llm-health busy` as a real process: marker file set while the job runs, removed after, exit code kept;
a lost marker is re-created, and the job is stopped loudly when it cannot be."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until


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


def _running(pid: int) -> bool:
    """pid is a live process (a zombie waiting for init to reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.parametrize("ttl", ["600", "0.6"], ids=["long-ttl", "short-ttl"])
def test_the_job_dies_with_a_killed_wrapper(tmp_path: Path, ttl: str) -> None:
    """kill -9 of the wrapper: nobody refreshes the marker any more, so the job must not outlive it. The
    job gets SIGTERM at once (PR_SET_PDEATHSIG), whatever its marker's remaining lifetime."""
    config = write_config(tmp_path)
    pid_file = tmp_path / "job.pid"
    proc = ManagedProcess(llm_health("busy", "--backend", "gpu-a", "--ttl", ttl, "--config", config, "--",
                                     "sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"),
                          name="busy", log_dir=tmp_path)
    job = 0
    try:
        wait_until(lambda: list((tmp_path / "busy").glob("gpu-a@*")), what="marker file")
        job = int(wait_until(lambda: pid_file.read_text().strip(), what="the job's pid"))
        wait_until(lambda: Path(f"/proc/{job}/cmdline").read_bytes().startswith(b"sleep\0"), what="the job's exec")
        assert _running(job)
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=10)
        wait_until(lambda: not _running(job), timeout=10, what="the job ending with its wrapper")
    finally:
        proc.stop()
        if job and _running(job):
            os.kill(job, signal.SIGKILL)


def test_f7_busy_wrapper_recreates_a_lost_marker(tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nsys.exit(0)"
    proc = ManagedProcess(llm_health("busy", "--backend", "gpu-a", "--ttl", "0.6", "--config", write_config(tmp_path, name="busy.yml"),
                                     "--", "python3", "-c", job), name="busy", log_dir=tmp_path)
    try:
        busy = tmp_path / "busy"
        (first,) = wait_until(lambda: list(busy.glob("gpu-a@*")), what="marker file")
        first.unlink()                                             # lost: removed by hand
        wait_until(lambda: list(busy.glob("gpu-a@*")), timeout=10, what="marker re-created")
        assert "re-created" in proc.log()
        go.write_text("")
        assert proc.proc.wait(timeout=10) == 0
    finally:
        proc.stop()


def test_f7_busy_wrapper_stops_loudly_when_the_marker_cannot_come_back(tmp_path: Path) -> None:
    ran_on = tmp_path / "still-running"
    job = f"import time\nwhile True:\n    open({str(ran_on)!r}, 'w').write(str(time.time()))\n    time.sleep(0.05)"
    proc = ManagedProcess(llm_health("busy", "--backend", "gpu-a", "--ttl", "0.6", "--config", write_config(tmp_path, name="busy.yml"),
                                     "--", "python3", "-c", job), name="busy", log_dir=tmp_path)
    try:
        busy = tmp_path / "busy"
        wait_until(lambda: list(busy.glob("gpu-a@*")) and ran_on.exists(), what="marker file and job running")

        def file_instead_of_folder() -> bool:
            """The folder gone and a file in its place; the wrapper may re-create the folder in between (it
            does its job: a lost marker comes back), then try again."""
            shutil.rmtree(busy, ignore_errors=True)
            try:
                busy.write_text("a file where the marker folder was")     # the marker cannot be written again
            except (IsADirectoryError, FileExistsError):
                return False
            return True

        wait_until(file_instead_of_folder, timeout=10, interval=0.01, what="a file where the marker folder was")
        assert wait_until(lambda: proc.proc.poll() is not None and [proc.proc.returncode], timeout=15,
                          what="busy wrapper stopping")[0] == 3
        assert "cannot be re-created" in proc.log()
    finally:
        proc.stop()
