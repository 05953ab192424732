"""What a previous holder left unfinished (remediator/recovery.py): an interrupted restart is never
repeated, and a restart in progress resumes where it was, whichever process opens the state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.store import IncidentState
from tests.support import stores
from tests.support.alerts import alert, one_pass, payload
from tests.support.remediator import World, fleet, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

S = LifecycleState


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_interrupted_restart_is_not_repeated(w: World) -> None:
    """A restart whose intent is recorded by a holder that died: the next authority never repeats it."""
    w.post(payload(alert()))
    with w.store.tx() as tx:
        inc = tx.active_incident("gpu-a")
        tx.add_action(inc.id, "gpu-a", "restart-a", "dead-worker", w.clock.t, w.clock.t, "")
        tx.move_incident(inc.id, w.clock.t, IncidentState.RESTARTING)
    w.run()
    w.clock.advance(100_000)
    w.post(payload(alert(alertname="LLMBackendDown")))
    w.run()
    assert w.calls == []
    assert w.incident().state == "needs_ack"
    assert "interrupted" in w.kinds("gpu-a")


def test_lifecycle_survives_a_crash_and_every_process_answers_the_same(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining"
    # the process dies; another one (another worker, or after a restart) opens the same state file
    other_app = create_app(w.config, clock=w.clock, with_authority=False)
    other = other_app.test_client()
    assert other.get("/api/backends").get_json()["backends"] == w.client.get("/api/backends").get_json()["backends"]
    agents = [AgentAnswers(stores.reopen(w.store), w.config, kv_reader=lambda url: 0.2) for _ in range(2)]
    assert {a.status_for("gpu-a").state for a in agents} == {S.DRAINING}
    second = Authority(stores.reopen(w.store), w.config, clock=w.clock, holder="second", runner=w.authority.io.runner,
                       verifier=w.authority.io.verifier, warmup_check=w.authority.io.warmup_check,
                       first_seen_check=w.authority.io.first_seen_check, in_flight=w.authority.io.in_flight)
    w.pass_time(w.authority.lease.ttl + 1)
    assert second.lease.renew()
    w.clock.advance(5)
    assert second.lease.renew()     # its lease thread's job (every ttl/4): no process starts on a lease's last second
    one_pass(second)                                 # resumes the drain where it was: deadline passed
    assert w.restarted == ["gpu-a"] and w.state() == "initializing"


def test_a_recovery_asked_for_while_one_runs_is_not_lost(w: World) -> None:
    """again() (a new term, an abort not recorded) while recover() runs: it was lost, as if_needed set
    `done` after recover() returned."""
    recovery = w.authority.recovery
    runs: list[int] = []

    def recover() -> None:
        runs.append(1)
        if len(runs) == 1:
            recovery.again()

    recovery.again()
    recovery.recover = recover              # type: ignore[method-assign]
    recovery.if_needed()
    recovery.if_needed()
    assert runs == [1, 1]
    recovery.if_needed()
    assert runs == [1, 1]
