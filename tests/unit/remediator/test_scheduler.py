"""The keyed work queue (remediator/scheduler.py): keys, not events; never one key on two threads."""

from __future__ import annotations

import threading
import time

from llm_health.drill.procs import wait_until
from llm_health.remediator.scheduler import KeyedQueue, Scheduler
from tests.support.fakes import FakeClock


def test_a_waiting_key_is_not_added_twice_and_keys_come_in_order() -> None:
    q = KeyedQueue()
    for key in ("a", "b", "a", "c", "b"):
        q.add(key)
    assert [q.get(timeout=0) for _ in range(3)] == ["a", "b", "c"]
    assert q.get(timeout=0) is None


def test_a_key_being_processed_is_never_handed_out_again_until_done() -> None:
    q = KeyedQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")                                   # new work while a worker has it: marked dirty
    assert q.get(timeout=0) is None              # ... and no second worker gets it
    assert q.processing() == {"a"}
    q.done("a")
    assert q.get(timeout=0) == "a"               # ... it runs again right after: no look is lost
    q.done("a")
    assert q.get(timeout=0) is None and q.processing() == set()


def test_done_without_new_work_does_not_requeue() -> None:
    q = KeyedQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert q.get(timeout=0) is None


def test_delayed_keys_come_when_due_in_the_order_of_their_due_times() -> None:
    clock = FakeClock(100.0)
    q = KeyedQueue(clock)
    q.add_after("late", 5.0)
    q.add_after("early", 1.0)
    q.add_after("same-time-2nd", 3.0)
    q.add_after("same-time-1st", 2.0)
    q.add_after("now", 0.0)                      # no delay: at once
    assert q.get(timeout=0) == "now"
    assert q.get(timeout=0) is None              # nothing else is due yet
    clock.advance(3.0)
    assert [q.get(timeout=0) for _ in range(3)] == ["early", "same-time-1st", "same-time-2nd"]
    assert q.get(timeout=0) is None
    clock.advance(2.0)
    assert q.get(timeout=0) == "late"


def test_a_delayed_key_due_while_processed_runs_again_after_done() -> None:
    clock = FakeClock(0.0)
    q = KeyedQueue(clock)
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add_after("a", 1.0)
    clock.advance(1.0)
    assert q.get(timeout=0) is None              # due, but a worker still has it
    q.done("a")
    assert q.get(timeout=0) == "a"


def test_processing_for_says_how_long_each_key_has_been_held() -> None:
    clock = FakeClock(10.0)
    q = KeyedQueue(clock)
    q.add("a")
    q.add("b")
    q.get(timeout=0)
    clock.advance(4.0)
    q.get(timeout=0)
    clock.advance(1.0)
    assert q.processing_for() == {"a": 5.0, "b": 1.0}


def test_close_wakes_every_waiting_worker() -> None:
    q = KeyedQueue()
    got: list[str | None] = []
    threads = [threading.Thread(target=lambda: got.append(q.get()), daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: all(t.is_alive() for t in threads), timeout=5, what="workers waiting")
    q.close()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads) and got == [None, None, None]
    q.add("a")
    assert q.get(timeout=0) is None              # closed: nothing more is handed out


def test_the_scheduler_never_works_on_one_key_in_two_threads_at_once() -> None:
    busy: set[str] = set()
    overlaps: list[str] = []
    looks: dict[str, int] = {}
    lock = threading.Lock()

    def work(key: str) -> float | None:
        with lock:
            if key in busy:
                overlaps.append(key)
            busy.add(key)
            looks[key] = looks.get(key, 0) + 1
        time.sleep(0.01)
        with lock:
            busy.discard(key)
        return 0.001                              # wants another look at once: re-added while processed

    s = Scheduler(keys=lambda: ["a", "b", "c"], work=work, workers=8, resync_every=0.01)
    s.start()
    try:
        wait_until(lambda: min(looks.get(k, 0) for k in "abc") >= 10, timeout=20, what="ten looks per key")
    finally:
        s.stop()
    assert overlaps == []
