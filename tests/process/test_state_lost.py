"""A lost state file with the real remediator under gunicorn: deleted while it runs (and a worker killed)
it stops and never makes a second store; the next start refuses and says how to start over.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.remediator import state_traces
from tests.support.alerts import alert, payload
from tests.support.remediator_process import AUTH, running, write_config


@pytest.fixture
def remediator(tmp_path: Path) -> Iterator[tuple[str, ManagedProcess]]:
    with running(tmp_path, 2, request_timeout=2) as served:
        yield served


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def test_f3_deleted_state_and_a_killed_worker_never_make_a_second_store(
        tmp_path: Path, remediator: tuple[str, ManagedProcess]) -> None:
    url, proc = remediator
    workers = wait_until(lambda: (w := children(proc.pid)) and len(w) == 2 and w, what="two workers")
    state = tmp_path / "state.db"
    assert state.exists()
    state.unlink()
    os.kill(workers[0], signal.SIGKILL)

    def stopped() -> bool:
        if not proc.alive():
            return True
        try:
            return requests.get(url + "/healthz", timeout=2).status_code == 503
        except requests.RequestException:
            return False

    wait_until(stopped, timeout=30, what="the remediator stopping (dead or unhealthy)")
    # never re-created behind the first store's back; and every answer says why
    assert not state.exists()
    if proc.alive():
        r = requests.post(url + "/webhook", json=payload(alert()), headers=AUTH, timeout=5)
        assert r.status_code == 503 and "deleted" in r.json()["error"]
    log = proc.log()
    assert "deleted" in log or "cannot open state" in log, log[-2000:]
    assert not state.exists()


def start(tmp_path: Path, config: Path, port: int, name: str) -> ManagedProcess:
    return ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                     "--workers", 1), name=name, log_dir=tmp_path)


@pytest.mark.timeout(180)
def test_the_real_remediator_refuses_to_start_on_a_lost_state(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    state = tmp_path / "state.db"
    port = free_port()
    first = start(tmp_path, config, port, "first")
    try:
        first.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        assert state.exists() and state_traces.id_file(state).exists()
        state.unlink()                                      # lost while it runs: it stops acting (issue 12)
        wait_until(lambda: not first.alive() or requests.get(f"http://127.0.0.1:{port}/healthz",
                                                             timeout=2).status_code == 503,
                   timeout=30, what="the first remediator stopping")
    finally:
        first.stop()
    again = start(tmp_path, config, port, "again")
    try:
        try:
            code = again.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:                   # it started and serves: that is the bug
            pytest.fail(f"the remediator started on an empty state:\n{again.log()[-2000:]}")
        log = again.log()
        assert code == 2 and "is missing" in log and "Traceback" not in log, log[-2000:]
        assert not state.exists()
    finally:
        again.stop()
    # starting over on purpose, as the message says
    (command,) = re.findall(r"\(rm -rf ([^)]*)\)", log)
    for path in shlex.split(command):
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    fresh = start(tmp_path, config, port, "fresh")
    try:
        fresh.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        assert state.exists() and state_traces.id_file(state).exists()
    finally:
        fresh.stop()
