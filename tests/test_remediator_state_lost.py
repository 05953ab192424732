"""A state file that disappears after it existed is never replaced by an empty one without a word.

The running remediator already stops when its state file is deleted (test_self_watch*); the next start
used to create an empty state, forgetting restart history, backoff, budgets and open incidents. Now a
start that finds no state file but traces of one (`<state>.id`, written when the state is created;
SQLite's `-wal`/`-shm`; the `.actions` folder) refuses and says how to start over on purpose.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
from llm_health.remediator import state_traces
from llm_health.remediator.store import SqliteStore, StateError

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from tests.support.remediator_process import write_config


def init(path: Path) -> None:
    store = SqliteStore(path)
    try:
        store.init()
    finally:
        store.close()


def test_a_new_state_gets_an_id_and_a_lost_one_is_not_recreated(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    init(state)                                             # a fresh install: nothing left of an older state
    assert state.exists() and state_traces.id_file(state).exists()
    init(state)                                             # an ordinary restart
    state.unlink()
    with pytest.raises(StateError, match="missing") as exc:
        init(state)
    assert str(state_traces.id_file(state)) in str(exc.value) and "rm -rf" in str(exc.value)
    assert not state.exists()                               # nothing created
    state_traces.id_file(state).unlink()                    # starting over, on purpose
    init(state)
    assert state.exists() and state_traces.id_file(state).exists()


@pytest.mark.parametrize("trace", ["state.db-wal", "state.db-shm", "state.db.actions"])
def test_sqlite_files_or_the_actions_folder_also_show_it_existed(tmp_path: Path, trace: str) -> None:
    """A state file from before `<state>.id` existed leaves these behind."""
    (tmp_path / trace).mkdir() if trace.endswith(".actions") else (tmp_path / trace).write_bytes(b"")
    with pytest.raises(StateError, match=re.escape(trace)):
        init(tmp_path / "state.db")
    assert not (tmp_path / "state.db").exists()


def test_a_state_file_from_before_the_check_gets_its_id_at_the_next_start(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    init(state)
    state_traces.id_file(state).unlink()                    # as an older version left it
    init(state)
    assert state_traces.id_file(state).exists()


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
