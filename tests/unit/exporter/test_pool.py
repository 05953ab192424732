"""exporter/pool.py Lane: bounded workers, a bound per key, round-robin turns between keys."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future

import pytest

from llm_health.drill.procs import wait_until
from llm_health.exporter.pool import Lane


class Gate:
    """Calls that block until released; notes the order in which they started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def call(self, name: str) -> str:
        with self.lock:
            self.started.append(name)
        self.release.wait(10)
        return name


def test_one_key_never_holds_more_than_its_bound_and_the_rest_get_their_turn() -> None:
    lane = Lane(workers=4, per_key=2, name="t")
    gate = Gate()
    try:
        hog = [lane.submit("hog", gate.call, f"hog{i}") for i in range(20)]
        other = lane.submit("other", gate.call, "other")
        wait_until(lambda: len(gate.started) == 3, timeout=5, what="3 calls started")
        assert sorted(gate.started) == ["hog0", "hog1", "other"]   # hog at its bound; other got a worker
        assert lane.busy() == 3 and lane.waiting() == 18
        gate.release.set()
        assert [f.result(timeout=10) for f in hog] == [f"hog{i}" for i in range(20)]
        assert other.result(timeout=10) == "other"
        wait_until(lambda: lane.busy() == 0, timeout=5, what="all done")
    finally:
        gate.release.set()
        lane.shutdown()


def test_a_freed_worker_goes_to_the_next_key_in_turn() -> None:
    lane = Lane(workers=1, per_key=1, name="t")
    gate = Gate()
    try:
        first = lane.submit("a", gate.call, "a0")
        wait_until(lambda: gate.started == ["a0"], timeout=5, what="a0 started")
        futures = [lane.submit("a", gate.call, f"a{i}") for i in range(1, 4)]
        futures += [lane.submit("b", gate.call, "b0"), lane.submit("c", gate.call, "c0")]
        gate.release.set()
        for f in [first, *futures]:
            f.result(timeout=10)
        # a had three more calls waiting, but b and c each got their turn before a's next ones
        assert gate.started[:4] == ["a0", "a1", "b0", "c0"], gate.started
    finally:
        gate.release.set()
        lane.shutdown()


def test_the_total_bound_holds_across_keys() -> None:
    lane = Lane(workers=3, per_key=3, name="t")
    gate = Gate()
    try:
        futures = [lane.submit(f"k{i}", gate.call, f"k{i}") for i in range(10)]
        wait_until(lambda: len(gate.started) == 3, timeout=5, what="3 started")
        assert lane.busy() == 3 and lane.waiting() == 7
        gate.release.set()
        assert sorted(f.result(timeout=10) for f in futures) == sorted(f"k{i}" for i in range(10))
    finally:
        gate.release.set()
        lane.shutdown()


def test_an_exception_reaches_the_future_and_frees_the_worker() -> None:
    lane = Lane(workers=1, per_key=1, name="t")

    def boom() -> None:
        raise RuntimeError("bad backend")

    try:
        failed = lane.submit("a", boom)
        with pytest.raises(RuntimeError, match="bad backend"):
            failed.result(timeout=5)
        assert lane.submit("a", lambda: 7).result(timeout=5) == 7
    finally:
        lane.shutdown()


def test_shutdown_cancels_what_waits() -> None:
    lane = Lane(workers=1, per_key=1, name="t")
    gate = Gate()
    running = lane.submit("a", gate.call, "a0")
    wait_until(lambda: gate.started == ["a0"], timeout=5, what="a0 started")
    waiting: Future[str] = lane.submit("a", gate.call, "a1")
    lane.shutdown()
    with pytest.raises(CancelledError):
        waiting.result(timeout=5)
    assert lane.submit("b", gate.call, "b0").cancelled()
    gate.release.set()
    assert running.result(timeout=5) == "a0"
