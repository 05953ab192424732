"""remediator.lifecycle: the transition table and the start gates (pure, fake clock); a transition outside
the table, asked of the store, is refused and audited."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator.lifecycle import (
    LEGAL,
    IllegalTransition,
    LifecycleState,
    Transition,
    may_drain,
    may_restart,
    may_start,
    transition,
    warmup_expired,
)
from tests.support.fakes import FakeClock
from tests.support.remediator import World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

S = LifecycleState


EXPECTED_LEGAL = {
    (S.READY, S.DRAINING),
    (S.READY, S.STOPPED),
    (S.DRAINING, S.STOPPED),
    (S.DRAINING, S.READY),
    (S.STOPPED, S.INITIALIZING),
    (S.INITIALIZING, S.READY),
    (S.INITIALIZING, S.ERROR),
    (S.ERROR, S.INITIALIZING),
    (S.READY, S.ERROR),
    (S.DRAINING, S.ERROR),
    (S.STOPPED, S.ERROR),
}


def test_table_is_exactly_the_documented_one() -> None:
    got = {(a, b) for a, targets in LEGAL.items() for b in targets}
    assert got == EXPECTED_LEGAL


@pytest.mark.parametrize("pair", sorted(itertools.product(S, S)))
def test_every_pair_is_legal_or_refused(pair: tuple[LifecycleState, LifecycleState]) -> None:
    a, b = pair
    if pair in EXPECTED_LEGAL:
        t = transition(a, b, 5.0, "why")
        assert t == Transition(source=a, target=b, at=5.0, reason="why")
    else:
        with pytest.raises(IllegalTransition) as err:
            transition(a, b, 5.0, "why")
        msg = str(err.value)
        assert f"{a.value} -> {b.value}" in msg and "only" in msg


def test_full_restart_cycle_with_fake_clock() -> None:
    clock = FakeClock(1000.0)
    state = S.READY
    log: list[Transition] = []
    for target, reason, dt in [
        (S.DRAINING, "stalled: restart begins", 0),
        (S.STOPPED, "in-flight finished", 12),
        (S.INITIALIZING, "restart action ran", 3),
        (S.READY, "model listed in /v1/models", 40),
    ]:
        clock.advance(dt)
        t = transition(state, target, clock(), reason)
        log.append(t)
        state = t.target
    assert state == S.READY
    assert [t.at for t in log] == [1000.0, 1012.0, 1015.0, 1055.0]


def test_warmup_timeout_leads_to_error_and_error_can_restart() -> None:
    clock = FakeClock(1000.0)
    entered = clock()
    clock.advance(899)
    assert not warmup_expired(entered, clock(), 900)
    clock.advance(1)
    assert warmup_expired(entered, clock(), 900)
    t = transition(S.INITIALIZING, S.ERROR, clock(), "warm-up timeout after 900s")
    assert transition(t.target, S.INITIALIZING, clock(), "manual restart").target == S.INITIALIZING
    with pytest.raises(IllegalTransition):
        transition(S.ERROR, S.READY, clock(), "cannot skip warm-up")


def test_reason_is_required_and_states_accept_strings() -> None:
    with pytest.raises(ValueError, match="reason"):
        transition(S.READY, S.DRAINING, 1.0, "  ")
    assert transition("ready", "stopped", 1.0, " already down ").reason == "already down"  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        transition("ready", "exploded", 1.0, "x")  # type: ignore[arg-type]


HOSTS = {"a1": "node-1", "a2": "node-1", "b1": "node-2", "c": ""}


@pytest.mark.parametrize("busy", [S.DRAINING, S.STOPPED, S.INITIALIZING])
def test_host_mutex_blocks_second_backend_on_same_host(busy: LifecycleState) -> None:
    states = {"a1": busy, "a2": S.READY, "b1": S.READY, "c": S.READY}
    ok, why = may_start("a2", "node-1", states, HOSTS)
    assert not ok and "a1" in why and busy.value in why
    ok, why = may_start("b1", "node-2", states, HOSTS)
    assert ok, why


@pytest.mark.parametrize("other", [S.READY, S.ERROR])
def test_host_mutex_allows_when_neighbour_not_restarting(other: LifecycleState) -> None:
    states = {"a1": other, "a2": S.READY}
    assert may_start("a2", "node-1", states, HOSTS)[0]


def test_host_mutex_no_host_and_self_restarting() -> None:
    states = {"a1": S.DRAINING, "c": S.READY, "x": S.DRAINING}
    assert may_start("c", "", states, {**HOSTS, "x": ""})[0]
    ok, why = may_start("a1", "node-1", states, HOSTS)
    assert not ok and "already draining" in why


def test_fleet_floor() -> None:
    states = {"a": S.READY, "b": S.READY, "c": S.DRAINING, "d": S.ERROR}
    assert may_drain("a", states, min_ready=1)[0]          # b is READY
    ok, why = may_drain("a", states, min_ready=2)
    assert not ok and "only 1 other" in why                # a itself does not count
    assert may_drain("a", states, min_ready=2, self_down=True)[0]
    assert may_drain("a", {"a": S.READY}, min_ready=0)[0]
    assert not may_drain("a", {"a": S.READY}, min_ready=1)[0]


def test_may_restart_combines_both_gates() -> None:
    states = {"a1": S.INITIALIZING, "a2": S.READY, "b1": S.READY}
    ok, why = may_restart("a2", states, HOSTS, min_ready=0)
    assert not ok and "same host" in why
    ok, why = may_restart("b1", states, HOSTS, min_ready=2)
    assert not ok and "min_ready" in why
    assert may_restart("b1", states, HOSTS, min_ready=1)[0]


# -- the table enforced by the store (tests.support.remediator) ------------------------------------
@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = fleet(tmp_path)
    yield world
    world.close()


def test_illegal_transition_is_refused_and_audited(w: World) -> None:
    with w.store.tx() as tx:
        assert not tx.move_lifecycle("gpu-a", S.INITIALIZING, w.clock.t, "skip the drain")
    assert w.state() == "ready"
    refused = w.store.events(kind="lifecycle_refused")
    assert len(refused) == 1 and "ready -> initializing" in refused[0].reason
    assert 'decision="lifecycle_refused"} 1' in w.client.get("/metrics").get_data(as_text=True)
