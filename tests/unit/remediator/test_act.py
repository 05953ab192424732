"""The restart action (remediator/restart/act.py): what its result leaves (a timeout is never retried
blindly; a failure is ERROR and the next restart starts from it), and exceptions between the claim and
the recorded result (a runner or a silence that raises, bookkeeping that cannot be written) never leave
a stuck state.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from llm_health.remediator import action
from llm_health.remediator.authority import Authority
from llm_health.remediator.restart import act as restart_act
from tests.support import stores
from tests.support.alerts import alert, one_pass, payload
from tests.support.remediator import World, fleet, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

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


def raising_runner(exc: Exception) -> Any:
    def run(argv: Sequence[str], timeout: float, env: dict[str, str]) -> action.ActionResult:
        raise exc
    return run


def test_runner_that_raises_leaves_needs_ack_error_and_frees_the_host(tmp_path: Path) -> None:
    w = fleet(tmp_path, hosts={"gpu-a": "n1", "gpu-b": "n1"})
    w.authority.io.runner = raising_runner(ValueError("embedded null byte"))
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False                      # still not answering: needs_ack stays
    w.deliver(payload(alert("gpu-a")))
    w.run()
    inc = w.last_incident()
    assert inc["state"] == "needs_ack" and inc["last_decision"] == "aborted"
    assert w.state("gpu-a") == "error"
    rows = stores.sql(w.store).execute("SELECT result, output FROM actions").fetchall()
    assert [r["result"] for r in rows] == ["error"] and "embedded null byte" in rows[0]["output"]
    aborted = w.store.events(kind="aborted")
    assert len(aborted) == 1 and "ValueError" in aborted[0].reason
    assert "escalated" in w.kinds("gpu-a")
    # the host mutex is free again: gpu-b on the same host can be restarted
    w.authority.io.runner = lambda argv, timeout, env: (w.restarted.append(env["LLM_HEALTH_BACKEND"])
                                                      or action.ActionResult(action.OK, 0, "ok"))
    w.outcomes["gpu-b"] = "down"
    w.deliver(payload(alert("gpu-b")))
    w.run()
    assert w.restarted == ["gpu-b"] and "restarted" in w.kinds("gpu-b")
    assert w.last_incident()["state"] == "needs_ack"                   # gpu-a: never repeated blindly


def test_silence_that_raises_is_handled_like_a_failed_restart(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    w = fleet(tmp_path)
    def locked(ctx: Any, incident_id: int, backend: Any) -> None:
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(restart_act, "silence", locked)
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.run()
    assert w.last_incident()["state"] == "needs_ack" and w.state() == "error"
    assert stores.sql(w.store).execute("SELECT count(*) FROM actions WHERE result IS NULL").fetchone()[0] == 0


def test_own_restart_whose_bookkeeping_failed_is_swept_by_recover(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    w = fleet(tmp_path)
    w.authority.io.runner = raising_runner(OSError("fork failed"))
    aborts: list[int] = []

    def abort_that_cannot_write(ctx: Any, incident_id: int, action_id: int, backend: Any, exc: BaseException) -> None:
        aborts.append(action_id)                  # as if SQLite stayed locked: nothing recorded
        ctx.on_abort_unrecorded()
    monkeypatch.setattr(restart_act, "abort", abort_that_cannot_write)
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.authority.lease.renew()
    one_pass(w.authority)
    assert aborts and w.last_incident()["state"] == "restarting"
    one_pass(w.authority)                            # recover() runs again and finds our own open row
    assert w.last_incident()["state"] == "needs_ack" and w.state() == "error"
    assert stores.sql(w.store).execute("SELECT result FROM actions").fetchone()[0] == "interrupted"
    assert w.store.events(kind="interrupted")[0].detail["own"] is True


# -- the lease right before the process starts (fencing) --------------------------------------------------
def test_the_action_runs_with_the_lease_epoch_in_its_environment(w: World) -> None:
    w.outcomes["gpu-a"] = "down"
    w.deliver(payload(alert()))
    w.run()
    assert w.restarted == ["gpu-a"]
    assert w.envs[0]["LLM_HEALTH_EPOCH"] == str(w.authority.lease.epoch) != "0"


def test_no_process_starts_when_the_lease_is_nearly_over(w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the claim and the process the lease ran low (a slow capture, a stalled renewal): the process
    is not started; still ours, so the restart is aborted into needs_ack (never repeated blindly)."""
    def slow_capture(ctx: Any, incident_id: int, backend: Any) -> None:
        w.pass_time(w.authority.lease.ttl * 0.6)
    monkeypatch.setattr(restart_act, "before_kill", slow_capture)
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.run(1)
    assert w.restarted == []
    assert w.last_incident()["state"] == "needs_ack"
    assert "action was not started" in w.store.events(kind="aborted")[0].reason


def test_a_deposed_holder_starts_nothing_and_leaves_the_incident_to_the_new_one(
        w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    other = Authority(w.store, w.authority.ctx.config, clock=w.clock, holder="other")

    def taken_meanwhile(ctx: Any, incident_id: int, backend: Any) -> None:
        w.pass_time(w.authority.lease.ttl + 1)
        assert other.lease.renew()
    monkeypatch.setattr(restart_act, "before_kill", taken_meanwhile)
    w.outcomes["gpu-a"] = "down"
    w.deliver(payload(alert()))
    one_pass(w.authority)
    assert w.restarted == []
    assert w.last_incident()["state"] == "restarting"            # untouched: the new holder's to decide
    assert stores.sql(w.store).execute("SELECT count(*) FROM actions WHERE result IS NULL").fetchone()[0] == 1
    assert "lost the lease" in w.store.events(kind="late_result")[0].reason
    assert not w.store.events(kind="aborted")
