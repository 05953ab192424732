"""The authority's write transactions, one at a time in this process, before the store's write lock.

Every write transaction of the cluster queues for one lock (SQLite's, PostgreSQL's WRITE_LOCK), first come
first served. In a storm the authority's workers (up to max_concurrent_incidents of them) reach it together,
each with a claim that holds it for many round trips, and a webhook arriving behind them waited for all of
them: the storm's first seconds, when the due backends' restarts are claimed at once, made the webhook's
p99 on PostgreSQL (measured: 68 and 53 ms over the whole storm, 93-112 ms in its first seconds). Taking
turns here first, the authority has at most one transaction in that queue, so a webhook waits for at most
one of them (44 and 51 ms; 68-76 ms in the first seconds), and the authority loses nothing: the store's lock
let one of them write at a time anyway.

The turn goes to the thread that has waited longest (fifo.Queue: the lease's renewal is never passed by
workers writing again and again), a wait for it ends after the store's own timeout (`timeout`, as a wait
for the store's lock would: StateError), and it is reentrant: a transaction opened inside another on the
same thread goes on to the store as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from llm_health.remediator.store.base import StateError, StateStore, Transaction
from llm_health.remediator.store.fifo import Queue

#: how long a transaction waits for its turn when the store names no timeout of its own
DEFAULT_TIMEOUT = 30.0


class SingleWriter:
    """`store` with its `tx()` taken one at a time by this process' threads; everything else is the store's."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._turn = Queue()
        self._owner: int | None = None

    @contextmanager
    def tx(self) -> Iterator[Transaction]:
        me = threading.get_ident()
        if self._owner == me:              # inside one of this thread's own: no second turn
            with self.store.tx() as tx:
                yield tx
            return
        timeout = float(getattr(self.store, "timeout", DEFAULT_TIMEOUT))
        if not self._turn.acquire(timeout=timeout):
            raise StateError(f"no turn to write within {timeout:g} s: another transaction of the authority held "
                             "it (remediator.state_timeout)")
        self._owner = me
        try:
            with self.store.tx() as tx:
                yield tx
        finally:
            self._owner = None
            self._turn.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def single_writer(store: StateStore) -> StateStore:
    """The store, its write transactions taken one at a time by this process' threads (once: an already
    wrapped store is returned as it is)."""
    if isinstance(store, SingleWriter):
        return cast(StateStore, store)
    return cast(StateStore, SingleWriter(store))
