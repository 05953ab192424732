"""Bounded worker lanes that no group of backends can take over.

A `Lane` runs at most `workers` calls at once, and at most `per_key` of them for one key (the
exporter's key is a backend's host:port). A call over either bound waits in its key's queue (never in
the thread pool's own FIFO), and a freed worker goes to the next key in round-robin order, so a key
with many waiting calls gets one turn like every other key. The exporter keeps two lanes (cycle.py):
backends that answered in time at their last reading, and the others. A dripping, hung or new backend
therefore waits behind its own kind, never in front of a healthy one.

`submit()` returns a `Future` at once; the call's start and end are the caller's business (Job).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Lane:
    def __init__(self, workers: int, per_key: int, name: str) -> None:
        self.workers = max(1, workers)
        self.per_key = max(1, per_key)
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._running: collections.Counter[str] = collections.Counter()
        self._total = 0
        self._waiting: dict[str, collections.deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]] = {}
        self._turns: collections.deque[str] = collections.deque()    # keys with waiting calls, in turn order
        self._closed = False

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            if key not in self._waiting:
                self._waiting[key] = collections.deque()
                self._turns.append(key)
            self._waiting[key].append((future, fn, args))
            self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Start waiting calls while workers are free: one per key per turn (under the lock)."""
        passes = len(self._turns)
        while self._total < self.workers and self._turns and passes > 0:
            key = self._turns.popleft()
            queue = self._waiting[key]
            if self._running[key] >= self.per_key:
                self._turns.append(key)            # at its bound: its turn comes again later
                passes -= 1
                continue
            future, fn, args = queue.popleft()
            if queue:
                self._turns.append(key)
            else:
                del self._waiting[key]
            if not future.set_running_or_notify_cancel():
                continue
            passes = len(self._turns)
            self._running[key] += 1
            self._total += 1
            self._pool.submit(self._run, key, future, fn, args)

    def _run(self, key: str, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the future's owner
            with self._lock:
                self._finished(key)
            future.set_exception(exc)
            return
        with self._lock:
            self._finished(key)
        future.set_result(result)

    def _finished(self, key: str) -> None:
        self._running[key] -= 1
        if self._running[key] <= 0:
            del self._running[key]
        self._total -= 1
        if not self._closed:
            self._dispatch()

    def busy(self) -> int:
        with self._lock:
            return self._total

    def waiting(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._waiting.values())

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            waiting = [f for q in self._waiting.values() for f, _, _ in q]
            self._waiting.clear()
            self._turns.clear()
        for f in waiting:
            f.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
