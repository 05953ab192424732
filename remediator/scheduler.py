"""Keyed concurrency for the authority: many incidents move at once, one incident never twice at once.

A `KeyedQueue` holds KEYS (a backend name; one active incident per backend), not events:

* `add(key)`: a key already waiting is not added twice; a key being processed is marked dirty and
  handed out again right after `done(key)`, so no look is lost and no key is worked on by two threads.
* `add_after(key, delay)`: due later (a heap on the injected monotonic clock).

The `Scheduler` runs a resync thread and `workers` worker threads. Every `resync_every` seconds the
resync asks `keys()` (the backends with an active incident, plus any housekeeping key) and adds them;
a worker takes a key, calls `work(key)`, which does one step and answers when to look again
(seconds, or None for "at the next resync"). A slow step (a 20 s verification, a restart action)
holds one worker, never the others. The store stays the truth: the queue only says who to look at.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("llm_health.remediator")


class KeyedQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[str] = []          # ready, in order
        self._queued: set[str] = set()       # in _queue
        self._processing: dict[str, float] = {}     # key -> when (clock) a worker took it
        self._dirty: set[str] = set()        # added while processing: again after done()
        self._delayed: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._closed = False

    def _offer(self, key: str) -> bool:
        """Under the lock: queue `key` unless it waits already; a key being processed is marked dirty
        instead. True when it was queued now."""
        if key in self._processing:
            self._dirty.add(key)
            return False
        if key in self._queued:
            return False
        self._queue.append(key)
        self._queued.add(key)
        return True

    def add(self, key: str) -> None:
        with self._cond:
            if self._offer(key):
                self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            heapq.heappush(self._delayed, (self._clock() + delay, next(self._seq), key))
            self._cond.notify()

    def _promote(self) -> float | None:
        """Move due delayed keys to the queue; seconds until the next one is due (None: none waiting)."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            self._offer(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> str | None:
        """The next key to work on (now marked processing), or None after `timeout` / when closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                wait = self._promote()
                if self._queue:
                    key = self._queue.pop(0)
                    self._queued.discard(key)
                    self._processing[key] = self._clock()
                    return key
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                waits = [w for w in (wait, left) if w is not None]
                self._cond.wait(min(waits) if waits else None)
            return None

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.pop(key, None)
            if key in self._dirty:
                self._dirty.discard(key)
                self._offer(key)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def processing(self) -> set[str]:
        with self._cond:
            return set(self._processing)

    def processing_for(self) -> dict[str, float]:
        """Every key a worker has now, with how long it has had it (seconds): /healthz's view of the workers."""
        with self._cond:
            now = self._clock()
            return {key: now - since for key, since in self._processing.items()}


class Scheduler:
    def __init__(self, *, keys: Callable[[], Iterable[str]], work: Callable[[str], float | None],
                 workers: int, resync_every: float, clock: Callable[[], float] = time.monotonic,
                 name: str = "remediator") -> None:
        self.queue = KeyedQueue(clock)
        self._keys = keys
        self._work = work
        self._workers = max(1, workers)
        self._resync_every = resync_every
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._name = name

    def start(self) -> None:
        targets = [(self._resync_loop, "resync")] + [(self._worker, f"worker-{i}") for i in range(self._workers)]
        for target, suffix in targets:
            t = threading.Thread(target=target, name=f"{self._name}-{suffix}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.queue.close()
        deadline = time.monotonic() + timeout          # one deadline for all: a worker may be mid-verification
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _resync_loop(self) -> None:
        while not self._stop.is_set():
            try:
                for key in self._keys():
                    self.queue.add(key)
            except Exception:  # noqa: BLE001 - keep resyncing; the store may be busy for a moment
                log.exception("resync failed")
            self._stop.wait(self._resync_every)

    def _worker(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            again: float | None = None
            try:
                again = self._work(key)
            except Exception:  # noqa: BLE001 - one key's failure never stops the others
                log.exception("work on %s failed", key)
                again = self._resync_every
            finally:
                self.queue.done(key)
            if again is not None and again < self._resync_every:
                self.queue.add_after(key, again)
