"""The authority's write transactions, one at a time in this process, before the store's write lock.

Every write transaction of the cluster queues for one lock (SQLite's, PostgreSQL's WRITE_LOCK), first come
first served. In a storm the authority's workers (up to max_concurrent_incidents of them) reach it together,
each with a claim that holds it for many round trips, and a webhook arriving behind them waited for all of
them: the storm's first seconds, when the due backends' restarts are claimed at once, made the webhook's
p99 on PostgreSQL (measured: 68 and 53 ms over the whole storm, 93-112 ms in its first seconds). Taking
turns here first, the authority has at most one transaction in that queue, so a webhook waits for at most
one of them (44 and 51 ms; 68-76 ms in the first seconds), and the authority loses nothing: the store's lock
let one of them write at a time anyway.

The turn is held for one transaction, whose deadlines are the store's (statement and lock timeouts, the
lease's renew deadline), which bounds every wait for it. It is reentrant: a transaction opened inside
another on the same thread goes on to the store as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from llm_health.remediator.store.base import StateStore, Transaction


class SingleWriter:
    """`store` with its `tx()` taken one at a time by this process' threads; everything else is the store's."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._turn = threading.RLock()

    @contextmanager
    def tx(self) -> Iterator[Transaction]:
        with self._turn, self.store.tx() as tx:
            yield tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def single_writer(store: StateStore) -> StateStore:
    """The store, its write transactions taken one at a time by this process' threads (once: an already
    wrapped store is returned as it is)."""
    if isinstance(store, SingleWriter):
        return cast(StateStore, store)
    return cast(StateStore, SingleWriter(store))
