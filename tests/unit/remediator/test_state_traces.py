"""A state file that existed and is gone is never replaced by an empty one without a word
(remediator/state_traces.py): a new state gets an id, a lost one is not recreated, SQLite's files or the
actions folder show it existed. The real remediator refusing to start: tests/process/test_state_lost.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llm_health.remediator import state_traces
from llm_health.remediator.store import SqliteStore, StateError


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
