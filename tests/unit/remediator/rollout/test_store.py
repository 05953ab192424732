"""The store's rollout verbs (remediator/store/sqlite/rollouts.py): typed rows in and out, a version-4 state
migrated forward, and a rollout's command stored with a restart's claim."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from llm_health.remediator.store import (
    CommandChange,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
    SqliteStore,
)
from llm_health.remediator.store.sqlite import schema


def new_rollout() -> tuple[Rollout, list[RolloutMember]]:
    r = Rollout(id=0, state=RolloutState.RUNNING, argv=("deploy", "{backend}"), canary=1, per_host=1, soak=60.0,
                gate={"interval": 5.0}, by="ops@h", reason="vLLM 0.9", created_at=1.0, updated_at=1.0)
    members = [RolloutMember(rollout_id=0, backend=n, host="n1", position=i, canary=i == 0, step=MemberStep.PENDING,
                             argv=("deploy", n), previous=None if i else ("old", n)) for i, n in enumerate(("a", "b"))]
    return r, members


def test_a_rollout_and_its_members_round_trip(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    r, members = new_rollout()
    with store.tx() as tx:
        rid = tx.add_rollout(r, members)
    got = store.rollout(rid)
    assert got is not None and got.argv == ("deploy", "{backend}") and got.gate == {"interval": 5.0} and got.active
    a, b = store.rollout_members(rid)
    assert (a.backend, a.canary, a.previous, b.previous) == ("a", True, ("old", "a"), None)
    with store.tx() as tx:
        tx.update_member(rid, "a", step=MemberStep.SOAKING, soak_started_at=5.0, note="soaking")
        with pytest.raises(ValueError, match="not a member field"):
            tx.update_member(rid, "a", argv="x")
    assert store.soaking("a") is not None and store.soaking("b") is None
    with store.tx() as tx:
        tx.move_rollout(rid, 9.0, RolloutState.SUCCEEDED, "done")
    done = store.rollout(rid)
    assert done is not None and done.finished_at == 9.0 and not done.active and store.active_rollouts() == []
    assert store.soaking("a") is None                    # only while the rollout is active
    assert store.rollout_counts() == {RolloutState.SUCCEEDED: 1}
    store.close()


def test_a_command_change_rides_on_the_incident_and_commands_are_stored(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    with store.tx() as tx:
        iid = tx.request_restart("a", 1.0, "rollout 1 (ops)", False, CommandChange(("deploy", "a"), 1))
        back = tx.request_restart("b", 1.0, "rollout 1 (ops)", False, CommandChange(None, None))
        plain = tx.request_restart("c", 1.0, "ops", False)
        tx.set_command("a", ("deploy", "a"), 2.0, 1)
    inc, inc_b, inc_c = store.incident(iid), store.incident(back), store.incident(plain)
    assert inc is not None and inc.command == CommandChange(("deploy", "a"), 1)
    assert inc_b is not None and inc_b.command == CommandChange(None, None)
    assert inc_c is not None and inc_c.command is None
    assert store.command("a") is not None and store.command("a").argv == ("deploy", "a")   # type: ignore[union-attr]
    with store.tx() as tx:
        tx.set_command("a", None, 3.0, None)
    assert store.command("a") is None and store.commands() == {}
    store.close()


def test_a_version_4_state_is_migrated_forward(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    with sqlite3.connect(path) as c:
        c.row_factory = sqlite3.Row
        for version, step in schema.MIGRATIONS:
            if version <= 4:
                step(c)
        c.execute("INSERT INTO incidents (backend, state, opened_at, updated_at) VALUES ('gpu-a', 'open', 1, 1)")
        c.execute("PRAGMA user_version = 4")
    store = SqliteStore(path)
    store.init()
    (inc,) = store.active_incidents()
    assert inc.command is None and store.active_rollouts() == [] and store.commands() == {}
    store.close()
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 7
