"""The authority's write transactions one at a time in the process (remediator/store/single_writer.py):
never two open at once, reentrant on one thread, everything else the store's; on PostgreSQL, a second
authority transaction waits in the process, not in the database's queue for WRITE_LOCK, where a webhook
would wait behind it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from llm_health.drill.procs import wait_until
from llm_health.remediator.store.postgresql import PostgresStore
from llm_health.remediator.store.single_writer import SingleWriter, single_writer
from tests.support.remediator import four_backends


class Counting:
    def __init__(self) -> None:
        self.open = 0
        self.most = 0
        self.lock = threading.Lock()
        self.path = "counting"

    @contextmanager
    def tx(self) -> Iterator[str]:
        with self.lock:
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            time.sleep(0.005)          # widen the window two transactions would need to overlap
            yield "tx"
        finally:
            with self.lock:
                self.open -= 1


def test_never_two_transactions_at_once_and_everything_else_is_the_stores() -> None:
    inner = Counting()
    store: Any = single_writer(inner)   # type: ignore[arg-type]

    def work() -> None:
        for _ in range(10):
            with store.tx():
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert inner.most == 1
    assert store.path == "counting" and single_writer(store) is store


def test_a_transaction_inside_another_on_one_thread_goes_on_to_the_store() -> None:
    inner = Counting()
    store: Any = SingleWriter(inner)    # type: ignore[arg-type]
    seen: list[Any] = []

    def nested() -> None:
        with store.tx(), store.tx() as tx:
            seen.append((tx, inner.open))

    t = threading.Thread(target=nested, daemon=True)   # a turn that is not reentrant would hang it: joined with
    t.start()                                          # a deadline, the test fails instead
    t.join(10)
    assert seen == [("tx", 2)]
    with store.tx():                                   # and the turn was given back
        assert inner.open == 1


def test_a_second_authority_transaction_waits_in_the_process_not_in_the_database(tmp_path: Path, pg_url: str) -> None:
    """Without the turn, the second one waited in PostgreSQL's queue for WRITE_LOCK (pg_locks: not granted),
    and a webhook arriving then waited for both."""
    from tests.support import stores

    with stores.using_postgres(lambda: pg_url):
        w = four_backends(tmp_path)
    try:
        assert isinstance(w.store, PostgresStore)
        authority_store = w.authority.ctx.store
        holding, release, second_done = threading.Event(), threading.Event(), threading.Event()

        def first() -> None:
            with authority_store.tx() as tx:
                tx.active_incidents()          # a read: the first round trip, the lock is held from here
                holding.set()
                release.wait(30)

        def second() -> None:
            with authority_store.tx() as tx:
                tx.active_incidents()
            second_done.set()

        a = threading.Thread(target=first)
        a.start()
        assert holding.wait(30)
        b = threading.Thread(target=second)
        b.start()
        with psycopg.connect(pg_url, autocommit=True) as c:
            def waiting_in_the_database() -> int:
                return int(c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                     "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                                     ).fetchone()[0])
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:           # watched for a second: nothing queues in the database
                assert waiting_in_the_database() == 0
                assert not second_done.is_set()
                time.sleep(0.05)
            release.set()
            wait_until(second_done.is_set, timeout=30, what="the second transaction, after the first")
        a.join(30)
        b.join(30)
    finally:
        w.close()


def test_the_turn_goes_to_the_thread_that_waited_longest_and_a_wait_has_a_deadline() -> None:
    """fifo.Queue: the lease's renewal, waiting behind a claim, is never passed by workers that come later; a
    turn not granted within the store's timeout is a StateError, as a wait for the store's lock would be."""
    from llm_health.remediator.store import StateError

    inner = Counting()
    inner.timeout = 0.2        # type: ignore[attr-defined]
    store: Any = SingleWriter(inner)    # type: ignore[arg-type]
    order: list[str] = []
    release = threading.Event()

    def holder() -> None:
        with store.tx():
            release.wait(30)

    def writer(name: str) -> None:
        with store.tx():
            order.append(name)

    first = threading.Thread(target=holder)
    first.start()
    wait_until(lambda: inner.open == 1, timeout=10, what="the first transaction open")
    with pytest.raises(StateError, match="no turn to write within 0.2 s"):
        with store.tx():
            pass
    inner.timeout = 30.0       # type: ignore[attr-defined]
    waiters = []
    for name in ("lease", "worker-1", "worker-2"):
        t = threading.Thread(target=writer, args=(name,))
        t.start()
        waiters.append(t)
        queued = len(waiters)
        wait_until(lambda: len(store._turn._waiters) == queued, timeout=10, what=f"{name} queued")  # noqa: B023
    release.set()
    for t in (first, *waiters):
        t.join(30)
    assert order == ["lease", "worker-1", "worker-2"]
