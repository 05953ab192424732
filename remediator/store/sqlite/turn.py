"""Writers of one SQLite state file take turns in a queue in front of SQLite's own write lock.

SQLite lets one writer in at a time and makes the others wait in its busy handler, which sleeps and
retries with growing sleeps (1, 2, 5, 10 ... 100 ms): a writer that has waited a while sleeps long and
newcomers pass it by. Under a storm of webhooks (4 gunicorn workers of 16 threads, each notification one
`BEGIN IMMEDIATE`) that unfairness is the tail: single waits over a second while the median is a few
milliseconds. So before `BEGIN IMMEDIATE` a writer takes its turn:

* in its process, a first-come first-served lock (`Queue`): the process' threads queue on it and the turn
  goes to the one that has waited longest (a `threading.Lock` lets whoever runs first take it, so a thread
  that writes again and again, such as the authority's, passes a webhook that has waited since);
* across processes, an exclusive `flock()` on `<state>-writer` beside the state file, asked for without
  blocking every `POLL` seconds (a blocking `flock()` cannot be given a deadline), by at most one thread
  per process: the one holding the process' lock.

The turn only orders writers; it guarantees nothing itself. SQLite's lock still decides (a writer that
does not take turns, such as `sqlite3` by hand, is still serialised by it). So a lock file that cannot be
opened (a read-only folder) leaves the process' threads queued and the processes to SQLite, and a turn
not granted within `timeout` fails as SQLite fails: `sqlite3.OperationalError` "database is locked".

A process that dies leaves the `flock()` to the kernel, which releases it. State is per process: a
forked child (gunicorn's workers) opens its own lock file and makes its own `threading.Lock`, as a
`flock()` on an inherited descriptor would be shared with the parent.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from llm_health.remediator.store.fifo import Queue

POLL = 0.0005          # seconds between two asks for the lock file, by the one waiting thread of a process


def lock_path(state: str) -> str:
    return state + "-writer"


class WriterTurn:
    def __init__(self, state: str, timeout: float = 30.0) -> None:
        self.path = lock_path(state)
        self.timeout = timeout
        self._pid = -1
        self._lock = Queue()
        self._fd: int | None = None
        self._setup = threading.Lock()

    def _mine(self) -> tuple[Queue, int | None]:
        """This process' lock and lock-file descriptor (made anew after a fork)."""
        pid = os.getpid()
        if self._pid != pid:
            with self._setup:
                if self._pid != pid:
                    self._lock = Queue()               # one inherited from the parent may be held there
                    try:
                        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                    except OSError:
                        self._fd = None                # SQLite alone orders the processes
                    self._pid = pid
        return self._lock, self._fd

    @contextmanager
    def held(self) -> Iterator[None]:
        """This thread's turn to write, for the duration of the block."""
        lock, fd = self._mine()
        deadline = time.monotonic() + self.timeout
        if not lock.acquire(timeout=self.timeout):
            raise sqlite3.OperationalError(f"database is locked (no turn to write within {self.timeout:g} s)")
        try:
            if fd is not None:
                _flock(fd, deadline, self.timeout)
            try:
                yield
            finally:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            lock.release()


def _flock(fd: int, deadline: float, timeout: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError(
                    f"database is locked (another process held the turn to write for {timeout:g} s)") from None
            time.sleep(POLL)
