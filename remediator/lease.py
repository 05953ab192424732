"""Who may act: the authority's lease in the store (one holder across threads, gunicorn workers, restarts).

Monotonic (clock.py): the lease expires on the clock of the boot it records, so a step of the wall clock
neither steals nor extends it. A holder that finds another boot's lease takes it and restarts the stored
monotonic deadlines from now (they mean nothing on this boot). Every claim and every recorded result checks
`holds(tx)` in its own transaction: a holder deposed while its action ran records nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from llm_health.remediator.clock import Clocks
from llm_health.remediator.store import Lease, StateStore, Transaction

log = logging.getLogger("llm_health.remediator")

NAME = "authority"


def _nothing() -> None:
    return None


class AuthorityLease:
    def __init__(self, store: StateStore, clocks: Clocks, holder: str, ttl: float, warmup_timeout: float) -> None:
        self.store = store
        self.clocks = clocks
        self.holder = holder
        self.ttl = ttl
        self.warmup_timeout = warmup_timeout     # a rebased warm-up gets this long again
        self.holding = threading.Event()
        #: the lease is (again) ours after someone else held it or it lapsed: what ran meanwhile may be
        #: unrecorded, so recovery must look (set by the authority)
        self.on_new_term: Callable[[], None] = _nothing

    def renew(self) -> bool:
        """Take or extend the lease; True while we hold it."""
        now, t, boot = self.clocks.wall(), self.clocks.mono(), self.clocks.boot
        with self.store.tx() as tx:
            row = tx.lease(NAME)
            other_boot = row is not None and row.boot != boot    # its expiry is another boot's clock
            if row is None or row.holder == self.holder or other_boot or row.expires_at < t:
                tx.put_lease(Lease(NAME, self.holder, t + self.ttl, boot))
                if row is not None and row.holder == self.holder and row.expires_at < t:
                    self.on_new_term()   # ours again after it lapsed
                if row is None or row.holder != self.holder:
                    self.on_new_term()   # newly ours: look for restarts a previous holder left unfinished
                    if other_boot:
                        tx.rebase_deadlines(t, t + self.warmup_timeout)
                    tx.event(now, "lease_acquired", reason=f"{self.holder} is the restart authority",
                             previous=row.holder if row else None)
                self.holding.set()
                return True
        self.holding.clear()
        return False

    def holds(self, tx: Transaction) -> bool:
        """Inside the caller's transaction: the lease is ours, on this boot, and not expired."""
        row = tx.lease(NAME)
        return (row is not None and row.holder == self.holder and row.boot == self.clocks.boot
                and row.expires_at >= self.clocks.mono())

    def keep(self, stop: threading.Event) -> None:
        """The lease thread: renew every ttl/4 until `stop`."""
        while not stop.is_set():
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - keep the authority alive; log and retry
                log.exception("lease renewal failed")
                self.holding.clear()
            stop.wait(self.ttl / 4)
