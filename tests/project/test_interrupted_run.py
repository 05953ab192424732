"""A test run stopped by SIGTERM or SIGHUP (a CI timeout, a closed terminal) still stops every process
its tests started: tests/conftest.py turns those signals into an interrupt, and pytest then tears the
fixtures down. Checked on a real pytest run with the suite's own conftest and `launch` fixture. The same
for a benchmark run (`python -m bench.run` under `timeout`): its servers are stopped too."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llm_health.drill.procs import wait_until
from tests.support.paths import REPO, TESTS

INNER = '''
import os, sys, threading
from pathlib import Path

def test_starts_a_process_and_waits(launch):
    p = launch([sys.executable, "-c", "import threading; threading.Event().wait(600)"], "sleeper")
    Path(os.environ["PID_FILE"]).write_text(str(p.pid))
    threading.Event().wait(600)   # the run is interrupted here
'''


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_killed_run_stops_what_its_tests_started(tmp_path: Path, signum: signal.Signals) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(TESTS / "conftest.py", run_dir / "conftest.py")
    (run_dir / "test_inner.py").write_text(INNER)
    pid_file = tmp_path / "pid"
    env = {**os.environ, "PID_FILE": str(pid_file), "CI": ""}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(run_dir)],
                           cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the inner test started")
        child = int(pid_file.read_text())
        assert alive(child)
        run.send_signal(signum)
        out, _ = run.communicate(timeout=30)
        assert run.returncode == 2, out  # pytest's "interrupted"
        assert "KeyboardInterrupt" in out, out
        wait_until(lambda: not alive(child), timeout=10, what="the started process stopped")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`, with their command lines."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out[int(entry)] = cmd
    return out


def test_a_killed_benchmark_stops_its_servers(tmp_path: Path) -> None:
    run = subprocess.Popen([sys.executable, "-m", "bench.run", "--quick", "--only", "storm", "--out", str(tmp_path)],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started: dict[int, str] = {}
    try:
        def servers() -> dict[int, str] | None:
            now = children(run.pid)
            found = {pid: cmd for pid, cmd in now.items() if "bench.pageserver" in cmd or " remediator " in cmd}
            return found if len(found) >= 2 else None

        started = wait_until(servers, timeout=60, interval=0.1, what="the storm's page server and remediator")
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
        assert "KeyboardInterrupt" in out, out
        wait_until(lambda: not any(alive(pid) for pid in started), timeout=15, what="the servers stopped")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
