"""The restart action (remediator/restart/act.py): what its result leaves (a timeout is never retried
blindly; a failure is ERROR and the next restart starts from it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_health.remediator import action

from tests.support.alerts import alert, payload
from tests.support.remediator import World, fleet, four_backends


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = fleet(tmp_path)
    yield world
    world.close()


def test_timed_out_action_is_never_retried_blindly(tmp_path: Path) -> None:
    w = four_backends(tmp_path)
    w.result = action.ActionResult(action.TIMEOUT, None, "killed")
    w.post(payload(alert()))
    w.run()
    w.clock.advance(100_000)
    w.run()
    assert len(w.calls) == 1 and w.incident().state == "needs_ack"
    w.ready["gpu-a"] = True                  # it does answer again: the incident closes by itself
    w.clock.advance(10)
    w.run()
    assert w.incident() is None and w.kinds("gpu-a")[-1] == "recovered"


def test_failed_action_is_error_and_the_next_restart_starts_from_it(w: World) -> None:
    w.result = action.ActionResult(action.FAILED, 2, "nope")
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.run()
    w.clock.advance(5)
    w.run()
    assert w.state() == "error" and w.restarted == ["gpu-a"]
    w.result = action.ActionResult(action.OK, 0, "ok")
    w.clock.advance(11)                           # backoff
    w.run()
    assert w.restarted == ["gpu-a", "gpu-a"] and w.steps()[-1] == ("error", "initializing")
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.state() == "ready"
