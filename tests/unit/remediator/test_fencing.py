"""Fencing: an authority that is not the lease's holder in the term its look began in writes nothing
(restart/context.py `Context.fenced`, lease.py `look()`), and an action's process starts only while its
intent is still open and the lease's spare time, counted from the check, has not run out
(restart/act.py `fit_to_start`).

Each test deposes the fixture's authority the way a frozen (SIGSTOP, a long GC pause) or cut-off leader is
deposed: its lease lapses and another authority takes the next term; then the deposed one carries on
from where it was, and must change nothing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_health.httpserver import QuietHandler
from llm_health.remediator import action, policy
from llm_health.remediator.authority import Authority
from llm_health.remediator.restart import act, warmup
from llm_health.remediator.restart.context import NotLeading
from llm_health.remediator.store import IncidentState, Silence
from tests.support import stores
from tests.support.alerts import alert, payload
from tests.support.loopback import Loopback
from tests.support.remediator import World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

IS = IncidentState


class Alertmanager:
    """Accepts silences (POST) and their expiry (DELETE), counting both."""

    def __init__(self) -> None:
        self.posts: list[str] = []
        self.deletes: list[str] = []
        seen = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.posts.append(self.path)
                self.reply_json(200, {"silenceID": str(uuid.uuid4())})

            def do_DELETE(self) -> None:  # noqa: N802
                seen.deletes.append(self.path)
                self.reply_json(200, {})

        self.server = Loopback(Handler)
        self.url = self.server.url


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


@pytest.fixture
def am() -> Iterator[Alertmanager]:
    fake = Alertmanager()
    yield fake
    fake.server.stop()


def successor(w: World) -> Authority:
    """The fixture's authority lapses (frozen past its lease); another takes the next term."""
    a = w.authority
    b = Authority(w.store, w.config, clock=w.clock, holder="other", runner=a.io.runner)
    w.pass_time(a.lease.ttl + 10)
    assert b.lease.renew() and b.lease.epoch == a.lease.epoch + 1
    return b


def warming(w: World) -> int:
    """gpu-a's incident, in its warm-up since a moment ago (as after a restart)."""
    w.deliver(payload(alert()))
    inc = w.store.active_incident("gpu-a")
    assert inc is not None
    with w.store.tx() as tx:
        tx.move_incident(inc.id, w.clock(), IS.WARMING, warm_deadline=w.clock() + 5)
    return inc.id


def claimed(w: World, by: Authority) -> tuple[int, int]:
    """gpu-a's incident with a restart claimed by `by` (its intent recorded, no outcome yet)."""
    w.deliver(payload(alert()))
    inc = w.store.active_incident("gpu-a")
    assert inc is not None
    backend = w.config.backend("gpu-a")
    assert backend is not None
    with w.store.tx() as tx:
        assert by.lease.holds(tx)
        action_id = act.claim(by.ctx, tx, inc.id, backend, policy.Decision(policy.RESTART, "test"), w.clock())
    return inc.id, action_id


def state(w: World, incident_id: int) -> tuple[Any, ...]:
    inc = w.store.incident(incident_id)
    assert inc is not None
    actions = [(r["id"], r["result"]) for r in stores.sql(w.store).execute("SELECT id, result FROM actions ORDER BY id").fetchall()]
    return inc.state, inc.last_decision, w.state("gpu-a"), actions


def test_a_deposed_authority_moves_no_incident_and_every_worker_stops(w: World) -> None:
    incident_id = warming(w)
    successor(w)
    before = state(w, incident_id)
    assert w.authority.lease.holding.is_set()          # it has not noticed yet
    with pytest.raises(NotLeading):                     # its warm-up ran past the deadline while it was frozen
        warmup.warmup_timed_out(w.authority.ctx, incident_id, "gpu-a", "")
    assert state(w, incident_id) == before              # not needs_ack, not ERROR: the new holder decides
    assert not w.authority.lease.holding.is_set()       # the other workers stop at their next look


def test_a_deposed_authority_does_not_settle_the_new_holders_intent(w: World) -> None:
    b = successor(w)
    incident_id, action_id = claimed(w, b)
    before = state(w, incident_id)
    with pytest.raises(NotLeading):                     # the old holder's recovery, late
        w.authority.recovery.recover()
    assert state(w, incident_id) == before
    action = w.store.action(action_id)
    assert action is not None and action.result is None and before[0] == IS.RESTARTING


def test_a_look_begun_in_an_older_term_writes_nothing_even_with_the_lease_ours_again(w: World) -> None:
    incident_id = warming(w)
    a = w.authority
    with a.lease.look() as term:
        w.pass_time(a.lease.ttl + 10)                   # frozen mid-look past its lease
        assert a.lease.renew() and a.lease.epoch == term + 1    # the lease thread took it back: a new term
        before = state(w, incident_id)
        with pytest.raises(NotLeading):                 # what the look read belongs to the old term
            warmup.warmup_timed_out(a.ctx, incident_id, "gpu-a", "")
        assert state(w, incident_id) == before
    assert a.lease.holding.is_set()                     # the lease is ours: only that look was stale
    warmup.warmup_timed_out(a.ctx, incident_id, "gpu-a", "")     # a look of the new term decides
    assert state(w, incident_id)[0] == IS.NEEDS_ACK


def test_an_intent_settled_by_another_term_is_never_started(w: World) -> None:
    """Claimed in term 1, frozen before the process started; term 2's holder found the intent without an
    outcome (interrupted, needs a person) and died; term 3 is ours again: the restart is not run now."""
    a = w.authority
    incident_id, action_id = claimed(w, a)
    b = successor(w)
    b.recovery.recover()
    assert state(w, incident_id)[0] == IS.NEEDS_ACK
    w.pass_time(b.lease.ttl + 10)
    assert a.lease.renew()
    backend = w.config.backend("gpu-a")
    assert backend is not None
    act.carry_out(a.ctx, incident_id, action_id, backend, with_silence=False)
    assert w.calls == []
    assert state(w, incident_id)[0] == IS.NEEDS_ACK


def test_a_process_that_would_start_after_the_lease_s_spare_time_is_not_started(w: World, monkeypatch: Any) -> None:
    """The check passed, then reading the argv (a slow pool, a database failover) or a freeze took the
    lease's whole spare time: nothing slow may sit unbounded between the check and the start."""
    a = w.authority
    incident_id, action_id = claimed(w, a)
    argv = act.stored_argv

    def slow(rd: Any, backend: Any, ctx: Any) -> tuple[str, ...]:
        w.clock.advance(a.lease.ttl)                    # this process' monotonic clock: the time it took
        return argv(rd, backend, ctx)

    monkeypatch.setattr(act, "stored_argv", slow)
    backend = w.config.backend("gpu-a")
    assert backend is not None
    act.carry_out(a.ctx, incident_id, action_id, backend, with_silence=False)
    assert w.calls == []
    assert state(w, incident_id)[0] == IS.NEEDS_ACK     # aborted: the intent is there, the outcome known (none)


def test_the_action_gets_the_term_its_look_began_in(w: World) -> None:
    a = w.authority
    w.deliver(payload(alert()))
    w.run()
    assert w.calls and w.envs[-1]["LLM_HEALTH_EPOCH"] == str(a.lease.epoch)


def test_a_deposed_authority_expires_no_silence(tmp_path: Path, am: Alertmanager) -> None:
    """Its warm-up timed out while it was frozen: it expired every silence on the backend (the new holder's
    among them) before its write found the lease gone."""
    w = four_backends(tmp_path, alertmanager_url=am.url)
    try:
        incident_id = warming(w)
        successor(w)
        theirs = str(uuid.uuid4())
        with w.store.tx() as tx:                        # the new holder's silence for its work on gpu-a
            tx.add_silence(Silence(theirs, "gpu-a", incident_id, w.clock(), w.clock() + 3600))
        with pytest.raises(NotLeading):
            warmup.warmup_timed_out(w.authority.ctx, incident_id, "gpu-a", "")
        assert am.deletes == []
        assert [s.id for s in w.store.active_silences("gpu-a")] == [theirs]
    finally:
        w.close()


def test_a_deposed_authority_leaves_no_silence_on_a_backend_that_needs_a_person(
        tmp_path: Path, am: Alertmanager) -> None:
    """Claimed in term 1 and frozen; term 2 settled the intent (needs a person) and unsilenced. Resumed, it
    silenced the backend's alerts, then refused to start the process: the pages stayed muted."""
    w = four_backends(tmp_path, alertmanager_url=am.url)
    try:
        a = w.authority
        incident_id, action_id = claimed(w, a)
        successor(w).recovery.recover()
        assert state(w, incident_id)[0] == IS.NEEDS_ACK
        backend = w.config.backend("gpu-a")
        assert backend is not None
        with a.lease.look():
            act.carry_out(a.ctx, incident_id, action_id, backend, with_silence=True)
        assert w.calls == [] and am.posts == [] and w.store.active_silences("gpu-a") == []
    finally:
        w.close()


def test_a_lease_lapsed_and_taken_back_while_the_action_ran_leaves_no_incident_restarting(w: World) -> None:
    """The action ran long, the lease lapsed and the lease thread took it back (a new term); the new term's
    recovery ran meanwhile and skipped the action (still running here). Its result, late for its term,
    was not recorded: with a runner that keeps no status file, the incident stayed RESTARTING for ever."""
    a = w.authority
    runs = a.io.runner

    def slow(argv: Any, timeout: float, env: dict[str, str]) -> action.ActionResult:
        w.pass_time(a.lease.ttl + 10)
        assert a.lease.renew()                          # a new term, ours
        resync = threading.Thread(target=a.recovery.if_needed)    # the resync thread, meanwhile
        resync.start()
        resync.join()
        return runs(argv, timeout, env)

    a.io.runner = a.ctx.io.runner = slow
    w.deliver(payload(alert()))
    w.run(1)
    assert len(w.calls) == 1
    w.run(2)
    inc = w.store.active_incident("gpu-a")
    assert inc is not None and inc.state == IS.NEEDS_ACK, inc     # outcome unknown for its term: a person decides
    assert len(w.calls) == 1                            # never repeated


def test_a_deposed_lifecycle_look_does_not_delay_that_backend_in_the_next_term(w: World) -> None:
    """The lifecycle watch set the backend's next look before its write found the lease gone: back in the
    lease, the backend waited up to max(30 s, 6 warm-up polls) for a look."""
    w.run(1)                                            # the lifecycle rows, READY
    stores.sql(w.store).execute("UPDATE lifecycle SET state = 'error', incident_id = NULL")   # looked at every 30 s
    a = w.authority
    successor(w)
    with a.lease.look(), pytest.raises(NotLeading):
        a.lifecycles.look("gpu-a")
    w.pass_time(a.lease.ttl + 10)
    assert a.lease.renew()
    assert "gpu-a" in a.lifecycles.due()


def test_a_deposed_authority_expires_no_silence_after_calling_a_rollouts_restart_off(
        tmp_path: Path, am: Alertmanager) -> None:
    """A rollout's call-off (a pause, a rollback) and the claim's own call-off end the drain's silence after
    their transaction: a holder deposed in between expired them all, the new holder's silence among them."""
    from llm_health.remediator.rollout.procedure import Procedure

    w = four_backends(tmp_path, alertmanager_url=am.url)
    try:
        successor(w)
        theirs = str(uuid.uuid4())
        with w.store.tx() as tx:                        # the new holder's silence for its work on gpu-a
            tx.add_silence(Silence(theirs, "gpu-a", None, w.clock(), w.clock() + 3600))
        proc = Procedure(w.authority.ctx)
        proc._unsilence.add("gpu-a")                    # called off in the look's transaction, before the lapse
        with pytest.raises(NotLeading):
            proc._end_silences()
        assert am.deletes == [] and [s.id for s in w.store.active_silences("gpu-a")] == [theirs]
    finally:
        w.close()
