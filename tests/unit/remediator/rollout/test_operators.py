"""A rollout and the operators' other commands at the same time: a restart asked for by hand, a pause, while
a member's restart with the new command is asked for and has not begun (held by a gate of the authority)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.remediator import AUTH
from tests.unit.remediator.rollout.test_procedure import NEW, Gate, rollout, start, steps, world

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

OPS = {"by": "ops2", "reason": "a1 looks slow"}


def test_a_restart_by_hand_never_takes_over_a_members_restart_with_the_new_command(tmp_path: Path) -> None:
    """It did: the operator's request replaced the rollout's incident and dropped its new command, a1
    restarted on the old one, and the canary was soaked and passed on the old version."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.authority.rollouts.look(rid)            # canary a1: its restart with the new command asked for, not begun
    assert w.incident("a1").state.value == "open" and w.incident("a1").command is not None
    r = w.client.post("/api/backends/a1/restart", json=OPS, headers=AUTH)
    assert r.status_code == 409 and f"rollout {rid}" in r.get_json()["error"], r.get_json()
    assert w.incident("a1").command is not None and w.incident("a1").requested_by != "ops2"
    assert "operator_refused" in w.kinds("a1")
    w.run_until(lambda: steps(w, rid)["a1"] != "restarting", "a1's restart ended", timeout=60)
    assert w.calls[0] == tuple(NEW[:3]) + ("a1", "node-1"), (w.calls, steps(w, rid))
    assert rollout(w, rid)["state"] == "running"
