"""A state file that existed and is gone is never replaced by an empty one without a word.

The state file holds the restart history, backoff, budgets, the breaker and open incidents. When it is
deleted while the remediator runs, the store stops (store.Store); a start that then created a new,
empty one would forget all of it, silently. So a start that finds no state file looks for traces of
one first:

* `<state>.id`, written next to the state file when it is created (and at the first start of a state
  file made before this check existed);
* `<state>-wal`, `<state>-shm`: SQLite's files of the lost database (they must not meet a new one);
* `<state>.actions/`: the restart actions' folder (remediator.action).

Any of them: the start is refused, with the list. To start over on purpose, remove what it lists
(docs/install.md); a fresh install has none of them.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path


def id_file(state: Path) -> Path:
    return state.with_name(state.name + ".id")


def traces(state: Path) -> list[Path]:
    """What shows that a state file existed at `state` (empty when nothing does)."""
    names = (state.name + ".id", state.name + "-wal", state.name + "-shm", state.name + ".actions")
    return [p for p in (state.with_name(n) for n in names) if os.path.lexists(p)]


def missing_state_message(state: Path, found: list[Path]) -> str:
    remove = " ".join(shlex.quote(str(p)) for p in found)
    return (f"state file {state} is missing, but {', '.join(str(p) for p in found)} show that it existed: "
            "starting with an empty state would forget the restart history, backoff, budgets and open "
            "incidents, so the remediator does not start. Restore the state file from a backup; or, to start "
            f"over with an empty state on purpose, remove what is left of the old one (rm -rf {remove}) and "
            "start again")


def write_id(state: Path) -> None:
    """`<state>.id` for the state file that exists now (kept when there is one)."""
    path = id_file(state)
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("llm-health remediator state; its existence shows the state file existed, see "
                   "docs/install.md before removing it\n")
    os.replace(tmp, path)
