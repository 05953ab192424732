"""A lock handed to its waiters in the order they came (sqlite/turn.py, single_writer.py): a `threading.Lock`
lets whoever runs first take it, so a thread that writes again and again, such as the authority's, passes
one that has waited since."""

from __future__ import annotations

import threading
from collections import deque


class Queue:
    """A lock handed to its waiters in the order they came: `acquire()` joins the end of the queue, `release()`
    hands the lock to the first waiter (who then holds it: nobody can take it in between)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Event] = deque()

    def acquire(self, timeout: float) -> bool:
        with self._mu:
            if not self._held:
                self._held = True
                return True
            mine = threading.Event()
            self._waiters.append(mine)
        try:
            if mine.wait(timeout):
                return True
        except BaseException:           # interrupted while waiting: never leave the lock to a waiter gone
            with self._mu:
                if not mine.is_set():
                    self._waiters.remove(mine)
                    raise
            self.release()              # it was handed over meanwhile: pass it on
            raise
        with self._mu:
            if mine.is_set():           # handed over between the timeout and now: it is ours
                return True
            self._waiters.remove(mine)
            return False

    def release(self) -> None:
        with self._mu:
            if self._waiters:
                self._waiters.popleft().set()
            else:
                self._held = False
