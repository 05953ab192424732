"""remediator/store/group.py: the writes of a process' threads of one moment share one transaction."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from llm_health.remediator.store import StateStore, Transaction
from llm_health.remediator.store.group import GroupCommit
from tests.support.stores import new_store


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.001)


class Gate:
    """store.tx, counted, whose first transaction waits at its start (as for the turn to write) until opened."""

    def __init__(self, store: StateStore, fail: Exception | None = None) -> None:
        self.store = store
        self.fail = fail
        self.opened = threading.Event()
        self.waiting = threading.Event()
        self.transactions = 0

    @contextmanager
    def tx(self) -> Iterator[Transaction]:
        if self.transactions == 0:
            self.waiting.set()
            assert self.opened.wait(timeout=30)
        self.transactions += 1
        if self.fail is not None:
            raise self.fail
        with self.store.tx() as tx:
            yield tx


@pytest.fixture
def store(tmp_path: Path, store_kind: str) -> Iterator[StateStore]:      # on SQLite and on PostgreSQL
    s = new_store(tmp_path)
    s.init()
    yield s
    s.close()


def write(name: str, fail: bool = False) -> Callable[[Transaction], int]:
    """A work: records an event, then says how many events it saw (its own and those before it)."""
    def work(tx: Transaction) -> int:
        tx.event(1.0, "signal", name, None, reason=name)
        if fail:
            raise ValueError(f"{name} is bad")
        return len(tx.events(limit=1000))
    return work


def run_queued(group: GroupCommit, gate: Gate, works: list[Callable[[Transaction], int]]
               ) -> dict[int, int | BaseException]:
    """The first work's thread leads and waits at the gate; the others queue meanwhile; then the gate opens."""
    out: dict[int, int | BaseException] = {}

    def call(i: int) -> None:
        try:
            out[i] = group.run(works[i])
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=call, args=(0,))]
    threads[0].start()
    assert gate.waiting.wait(timeout=30)
    for i in range(1, len(works)):
        threads.append(threading.Thread(target=call, args=(i,)))
        threads[-1].start()
        wait_for(lambda n=i + 1: len(group._queue) == n, f"{i + 1} queued")
    gate.opened.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return out


def reasons(store: StateStore) -> list[str]:
    return [e.reason for e in reversed(store.events(limit=1000))]


def test_the_writes_queued_while_the_first_waits_for_its_turn_go_in_one_transaction(store: StateStore) -> None:
    gate = Gate(store)
    group = GroupCommit(gate)
    out = run_queued(group, gate, [write(n) for n in "abcde"])
    assert gate.transactions == 1 and group.batches == 1
    assert out == {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}       # in arrival order, each seeing those before it
    assert reasons(store) == list("abcde")


def test_a_bad_write_fails_alone_and_leaves_nothing_behind(store: StateStore) -> None:
    gate = Gate(store)
    group = GroupCommit(gate)
    out = run_queued(group, gate, [write("a"), write("b", fail=True), write("c")])
    assert isinstance(out[1], ValueError) and str(out[1]) == "b is bad"
    assert out[0] == 1 and out[2] == 2
    assert reasons(store) == ["a", "c"]                 # b's event rolled back, a's and c's once each
    assert gate.transactions == 1 + 3                   # the batch, rolled back; then each alone


def test_a_database_error_in_one_write_fails_it_alone(store: StateStore) -> None:
    """A real error of the database (a second active incident of one backend breaks a unique index): on
    PostgreSQL it aborts the shared transaction, on SQLite only its statement; either way only it fails."""
    def second_incident(tx: Transaction) -> int:
        tx.event(1.0, "signal", "gpu-a", None, reason="b")
        tx.open_incident("gpu-a", 1.0)
        return tx.open_incident("gpu-a", 2.0)
    gate = Gate(store)
    out = run_queued(GroupCommit(gate), gate, [write("a"), second_incident, write("c")])
    assert out[0] == 1 and out[2] == 2 and isinstance(out[1], Exception)
    assert "one_active_incident" in str(out[1]) or "UNIQUE" in str(out[1]).upper()
    assert reasons(store) == ["a", "c"] and store.active_incidents() == []


def test_a_store_that_fails_under_a_batch_fails_it_at_once(store: StateStore) -> None:
    """A lock or statement timeout (PostgreSQL asks for its lock with the first statement) met by one work:
    the others would meet it too, one timeout after another; they fail with it instead."""
    def timed_out(tx: Transaction) -> int:
        raise sqlite3.OperationalError("database is locked")
    gate = Gate(store)
    out = run_queued(GroupCommit(gate), gate, [write("a"), timed_out, write("c")])
    assert all(isinstance(v, sqlite3.OperationalError) for v in out.values()) and len(out) == 3
    assert gate.transactions == 1 and reasons(store) == []


def test_a_store_that_cannot_open_a_transaction_fails_everyone_queued_at_once(store: StateStore) -> None:
    gate = Gate(store, fail=RuntimeError("state is gone"))
    group = GroupCommit(gate)
    out = run_queued(group, gate, [write(n) for n in "abc"])
    assert all(isinstance(v, RuntimeError) for v in out.values()) and len(out) == 3
    assert gate.transactions == 1                        # not three waits for the same broken store
    assert reasons(store) == []


def test_more_writers_than_one_batch_holds_hand_the_lead_on(store: StateStore) -> None:
    gate = Gate(store)
    group = GroupCommit(gate, max_batch=2)
    out = run_queued(group, gate, [write(n) for n in "abcde"])
    assert out == {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}
    assert gate.transactions == 3                        # ab, cd, e
    assert reasons(store) == list("abcde")
    assert group.run(write("f")) == 6 and not group._leading    # and the next one leads at once


def test_one_writer_alone_writes_at_once(store: StateStore) -> None:
    group = GroupCommit(store)
    assert group.run(write("a")) == 1
    with pytest.raises(ValueError, match="b is bad"):
        group.run(write("b", fail=True))
    assert reasons(store) == ["a"] and group.batches == 0
