"""A test run stopped by SIGTERM or SIGHUP (a CI timeout, a closed terminal) still stops every process
its tests started: tests/conftest.py turns those signals into an interrupt, and pytest then tears the
fixtures down. Checked on a real pytest run with the suite's own conftest and `launch` fixture."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llm_health.drill.procs import wait_until
from tests.support.paths import TESTS

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
