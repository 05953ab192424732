"""Group commit: the short writes of one process' threads (the webhook's) share one write transaction.

In a storm every notification is one write transaction, and the writers queue for the state's write lock
(SQLite's, behind turn.py; PostgreSQL's WRITE_LOCK): each holds it for its statements, its COMMIT (a
write-ahead log flush) and the hand-over to the next writer, and the lock, not the CPU, sets the pace.
So the threads of one process that want to write at the same time go together: the first becomes the
leader and opens the transaction; whoever queued before it takes the queue joins it (those that came
while the previous batch ran, and on SQLite those that came while the leader waited for the turn to
write; PostgreSQL's lock is asked for with the first statement, after the queue is taken); the leader
runs every queued work in arrival order (each sees the writes of those before it, as if they had run one
after the other), commits once, and hands the leadership to the first thread queued after its batch
(LevelDB's writer queue; PostgreSQL's commit_delay is the same idea inside the server).

Nothing is answered before it is committed: a caller gets its work's result once the transaction that
holds it has committed. A batch is all or nothing, so when one work of a batch raises, the batch is
rolled back and each of its works runs again alone, in a transaction of its own: one bad notification
fails alone and changes nothing, and the others are recorded as if it had not come. When the store
itself fails (no transaction, a lock or statement timeout, a lost connection, a failed commit:
`store_trouble`), every work of the batch fails with it at once, not one timeout after another.

A work is a transaction's body: it reads and writes through the `Transaction` only (no other side
effect, as it may run twice) and must not wait for anything but the store. Deadlines are the store's
own (the turn's and the statements' timeouts), which bound every batch and so every queued caller.

State is per process: after a fork (gunicorn's workers) the child makes its own queue and lock.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Generic, Protocol, TypeVar

from llm_health.remediator.store.base import StateError, Transaction

T = TypeVar("T")

#: the most works in one transaction (a transaction of many is held as long as their sum)
MAX_BATCH = 32


class Writable(Protocol):
    def tx(self) -> AbstractContextManager[Transaction]: ...      # a StateStore's


class _Pending(Generic[T]):
    __slots__ = ("work", "wake", "finished", "result", "error")

    def __init__(self, work: Callable[[Transaction], T]) -> None:
        self.work = work
        self.wake = threading.Event()     # set when finished, or when this thread is to lead the next batch
        self.finished = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def finish(self, result: T | None = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.finished = result, error, True
        self.wake.set()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class GroupCommit:
    """`run(work)`: the work's result, once committed, in a transaction shared with the process' other
    writers of the moment (see the module's docstring)."""

    def __init__(self, store: Writable, max_batch: int = MAX_BATCH) -> None:
        self.store = store
        self.max_batch = max_batch
        self._pid = -1
        self._setup = threading.Lock()
        self._mu = threading.Lock()
        self._queue: deque[_Pending] = deque()
        self._leading = False
        self.batches = 0          # transactions committed with more than one work in them (for the tests)

    def _mine(self) -> threading.Lock:
        pid = os.getpid()
        if self._pid != pid:
            with self._setup:
                if self._pid != pid:         # a fork's child: the parent's queue and lock are not ours
                    self._mu, self._queue, self._leading, self._pid = threading.Lock(), deque(), False, pid
        return self._mu

    def run(self, work: Callable[[Transaction], T]) -> T:
        mu = self._mine()
        mine: _Pending[T] = _Pending(work)
        with mu:
            self._queue.append(mine)
            leads = not self._leading
            self._leading = True
        if not leads:
            mine.wake.wait()          # bounded by the leader's transaction, whose deadlines are the store's
            if mine.finished:
                return mine.outcome()
        try:                          # leading: the first to come, or woken to lead the next batch
            self._batch(mu)
        finally:
            self._hand_over(mu)
        return mine.outcome()

    def _take(self, mu: threading.Lock) -> list[_Pending]:
        with mu:
            return [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch))]

    def _batch(self, mu: threading.Lock) -> None:
        """One transaction with the queued works (the leader's own first among them)."""
        batch: list[_Pending] = []
        try:
            with self.store.tx() as tx:
                batch = self._take(mu)
                results = [p.work(tx) for p in batch]
        except Exception as exc:
            if not batch or len(batch) == 1 or store_trouble(exc):
                # the store itself failed (no transaction, a lock or statement timeout, a lost connection):
                # the others would meet the same, one timeout after another; so they fail with it now
                for p in batch or self._take(mu):
                    p.finish(error=exc)
                return
            try:                      # one work raised: rolled back; each alone, so only a bad one fails
                for p in batch:
                    self._alone(p)
            finally:
                _fail_unfinished(batch)
            return
        except BaseException:         # the leader's thread is interrupted: its followers are told, not left waiting
            _fail_unfinished(batch or self._take(mu))
            raise
        if len(batch) > 1:
            self.batches += 1
        for p, r in zip(batch, results, strict=True):
            p.finish(result=r)

    def _alone(self, p: _Pending) -> None:
        try:
            with self.store.tx() as tx:
                r = p.work(tx)
        except Exception as exc:
            p.finish(error=exc)
        else:
            p.finish(result=r)

    def _hand_over(self, mu: threading.Lock) -> None:
        with mu:
            if self._queue:
                self._queue[0].wake.set()      # not finished: woken, it leads the next batch
            else:
                self._leading = False


def store_trouble(exc: BaseException) -> bool:
    """The store failed, not a work: StateError, or an OperationalError of the database's driver (PEP 249's
    name for lock and statement timeouts, lost connections, a database that cannot be written)."""
    return isinstance(exc, StateError) or any(c.__name__ == "OperationalError" for c in type(exc).__mro__)


def _fail_unfinished(batch: list[_Pending]) -> None:
    for p in batch:
        if not p.finished:
            p.finish(error=RuntimeError("the thread writing this transaction was interrupted"))
