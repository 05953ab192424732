"""remediator/store/sqlite/turn.py: writers of one state file take turns before SQLite's lock."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from llm_health.remediator.store import SqliteStore
from llm_health.remediator.store.fifo import Queue
from llm_health.remediator.store.sqlite.turn import WriterTurn, lock_path

HOLD = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def hold_in_another_process(path: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def release(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=10)


def test_another_process_holding_the_turn_keeps_a_writer_out_until_it_lets_go(tmp_path: Path) -> None:
    state = str(tmp_path / "state.db")
    turn = WriterTurn(state, timeout=0.3)
    p = hold_in_another_process(lock_path(state))
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            with turn.held():
                pass
    finally:
        release(p)
    with turn.held():        # free again: granted at once
        pass


def test_the_store_writes_in_its_turn(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    store._turn.timeout = 0.3
    p = hold_in_another_process(lock_path(os.path.abspath(store.path)))
    try:
        with pytest.raises(sqlite3.OperationalError, match="no turn|held the turn"):
            with store.tx() as tx:
                tx.remember_delivery("k", 1.0, forget_before=0.0)
    finally:
        release(p)
    with store.tx() as tx:
        tx.remember_delivery("k", 1.0, forget_before=0.0)
    with store.reader() as r:
        assert r.delivery_seen_at("k") == 1.0
    store.close()


def test_a_forked_child_takes_its_own_turn_not_its_parents(tmp_path: Path) -> None:
    """gunicorn forks its workers: a flock() on a descriptor inherited from the parent is the parent's own
    lock, so the child would write while the parent does."""
    turn = WriterTurn(str(tmp_path / "state.db"), timeout=0.3)
    with turn.held():                     # the parent's lock file is open before the fork
        pass
    held_r, held_w = os.pipe()
    pid = os.fork()
    if pid == 0:                          # the child: once the parent holds the turn, none for it
        code = 3
        try:
            os.read(held_r, 1)
            with turn.held():
                code = 1
        except sqlite3.OperationalError:
            code = 0
        finally:
            os._exit(code)
    with turn.held():
        os.write(held_w, b"x")
        _, status = os.waitpid(pid, 0)
    os.close(held_r)
    os.close(held_w)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_thread_waits_while_another_thread_of_its_process_writes(tmp_path: Path) -> None:
    turn = WriterTurn(str(tmp_path / "state.db"), timeout=0.3)
    inside, done = threading.Event(), threading.Event()

    def write() -> None:
        with turn.held():
            inside.set()
            done.wait(timeout=30)

    t = threading.Thread(target=write)
    t.start()
    try:
        assert inside.wait(timeout=30)
        with pytest.raises(sqlite3.OperationalError, match="no turn to write within 0.3 s"):
            with turn.held():
                pass
    finally:
        done.set()
        t.join(timeout=30)
    with turn.held():
        pass


def test_a_lock_file_that_cannot_be_made_leaves_the_order_to_sqlite(tmp_path: Path) -> None:
    turn = WriterTurn(str(tmp_path / "no-such-folder" / "state.db"), timeout=0.3)
    with turn.held():
        pass
    assert turn._fd is None


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.001)


def test_the_process_turn_goes_to_the_thread_that_waited_longest() -> None:
    q = Queue()
    assert q.acquire(timeout=1)
    order: list[str] = []

    def take(name: str) -> None:
        assert q.acquire(timeout=30)
        order.append(name)
        q.release()

    threads = []
    for name in "abc":                       # queued one after the other
        t = threading.Thread(target=take, args=(name,))
        t.start()
        threads.append(t)
        queued = len(threads)
        wait_for(lambda queued=queued: len(q._waiters) == queued, f"waiter {name}")
    q.release()
    for t in threads:
        t.join(timeout=30)
    assert order == ["a", "b", "c"]


def test_a_thread_that_lets_go_and_asks_again_at_once_comes_after_the_one_that_waits() -> None:
    """A threading.Lock goes to whoever runs first at its release: the thread that just let go and asks
    again at once (the authority's workers, writing one transaction after another) takes it back, before
    a webhook that waited. Here the turn has gone to the waiter by the time the releaser asks again."""
    q = Queue()
    assert q.acquire(timeout=1)
    got, done = threading.Event(), threading.Event()

    def wait_then_hold() -> None:
        assert q.acquire(timeout=30)
        got.set()
        done.wait(timeout=30)
        q.release()

    t = threading.Thread(target=wait_then_hold)
    t.start()
    try:
        wait_for(lambda: len(q._waiters) == 1, "the waiter")
        q.release()
        assert q.acquire(timeout=0.2) is False        # asked again at once: the waiter holds it
        assert got.wait(timeout=30)
    finally:
        done.set()
        t.join(timeout=30)
    assert q.acquire(timeout=30) is True
    q.release()


def test_a_thread_whose_wait_ends_leaves_the_queue() -> None:
    q = Queue()
    assert q.acquire(timeout=1)
    assert q.acquire(timeout=0.05) is False
    assert not q._waiters
    q.release()                               # nobody waits: free
    assert q.acquire(timeout=0) is True
    q.release()
