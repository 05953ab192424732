"""Who may act: the authority's lease in the store (one holder across threads, gunicorn workers, restarts).

Its clock: on a store every holder shares across hosts (PostgreSQL) the database's clock, one clock for
the whole cluster (`Transaction.lease_clock`); on SQLite (one host) the monotonic clock (clock.py) of the
boot it records, so a step of the wall clock neither steals nor extends it, and a holder that finds another
boot's lease takes it at once. Either way a holder that takes over from another boot restarts the stored
monotonic deadlines (incidents, drains) from now: they were on the previous holder's clock. Every claim and every recorded result checks
`holds(tx)` in its own transaction: a holder deposed while its action ran records nothing.

Every takeover starts a new term: the stored epoch goes up by one (a fencing token). `holds(tx)` is true
only while the stored epoch is the one this holder took, so a holder that lost the lease, even to itself
after a lapse, never writes under the old term; an action's process gets the epoch in its environment
(LLM_HEALTH_EPOCH) and starts only while the lease has `ACTION_MARGIN` of its time left.

A look (one worker's pass at one key) decides from what it read under the term it began in: `look()`
pins that term for the worker's thread, and `holds(tx)` inside the look asks for that term, not the
newest. A look that began under term 1, was frozen past the lease and resumed after the lease came back
to this holder as term 3 writes nothing: what it read may be stale, and term 2's holder may have acted.
A `holds(tx)` that finds the lease gone also clears `holding`, so every other worker stops at its next
look, not at the lease thread's next renewal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llm_health.remediator.clock import Clocks, boot_id
from llm_health.remediator.store import Lease, Reads, StateStore

log = logging.getLogger("llm_health.remediator")

NAME = "authority"
#: an action's process starts only while this share of the lease's time is left (renewed every quarter)
ACTION_MARGIN = 0.5


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
        self.epoch = 0                           # the term we hold (0: none yet)
        self._look = threading.local()           # .term: the term the calling thread's look began in
        #: the lease is (again) ours after someone else held it or it lapsed: what ran meanwhile may be
        #: unrecorded, so recovery must look (set by the authority)
        self.on_new_term: Callable[[], None] = _nothing

    def _time_base(self, tx: Reads) -> tuple[float, bool]:
        """(now on the lease's clock, shared): the store's own clock when it has one every holder shares
        (PostgreSQL: the database's), else this host's monotonic clock (SQLite: one host)."""
        shared = tx.lease_clock()
        return (self.clocks.mono(), False) if shared is None else (shared[0], True)

    def renew(self) -> bool:
        """Take or extend the lease; True while we hold it."""
        now, boot = self.clocks.wall(), self.clocks.boot
        with self.store.tx() as tx:
            t, shared = self._time_base(tx)
            row = tx.lease(NAME)
            # `boot` names the holder's monotonic clock, which the stored deadlines use. On its own clock
            # (SQLite) a lease of another boot has an expiry that means nothing here: taken at once. On a
            # shared clock its expiry holds for everyone, and only the deadlines need rebasing.
            other_boot = row is not None and row.boot != boot
            if row is None or row.holder == self.holder or (other_boot and not shared) or row.expires_at < t:
                stored = row.epoch if row is not None else 0
                same_term = (row is not None and row.holder == self.holder and not other_boot
                             and row.expires_at >= t and stored == self.epoch > 0)
                epoch = stored if same_term else stored + 1
                tx.put_lease(Lease(NAME, self.holder, t + self.ttl, boot, epoch))
                if not same_term:
                    # a new term: ours for the first time, again after it lapsed, or after another boot
                    self.epoch = epoch
                    self.on_new_term()   # look for restarts a previous term left unfinished
                    if other_boot:
                        mono = self.clocks.mono()
                        tx.rebase_deadlines(mono, mono + self.warmup_timeout)
                    tx.event(now, "lease_acquired", reason=f"{self.holder} is the restart authority (epoch {epoch})",
                             previous=row.holder if row else None, epoch=epoch)
                self.holding.set()
                return True
        self.holding.clear()
        return False

    @contextmanager
    def look(self) -> Iterator[int]:
        """Pin, for the calling thread, the term its look begins in (yielded; 0: none held)."""
        self._look.term = self.epoch if self.holding.is_set() else 0
        try:
            yield self._look.term
        finally:
            del self._look.term

    def term(self) -> int:
        """The term the calling thread acts for: its look's (pinned by look()), else the newest we took."""
        return getattr(self._look, "term", self.epoch)

    def holds(self, tx: Reads) -> bool:
        """In the caller's transaction (or a read of the store): the lease is ours, in the caller's term
        (term()), on this boot, and not expired. False also clears `holding`: the other workers stop too,
        until the lease thread takes the lease again (a new term)."""
        return self.left(tx) >= 0.0

    def left(self, tx: Reads) -> float:
        """Inside the caller's transaction: seconds the lease we hold has left in the caller's term (-inf:
        not ours, another term, another boot's clock, or expired: then `holding` is cleared too; or ours, but
        in a newer term than the caller's look)."""
        row = tx.lease(NAME)
        ours = (row is not None and row.holder == self.holder and row.boot == self.clocks.boot
                and row.epoch == self.epoch > 0)
        left = row.expires_at - self._time_base(tx)[0] if ours and row is not None else float("-inf")
        if left < 0.0:
            self.holding.clear()
            return float("-inf")
        return left if self.term() == self.epoch else float("-inf")

    def spare(self, tx: Reads) -> float:
        """Seconds until the lease (ours, in the caller's term) has less than ACTION_MARGIN of its time left
        (negative or -inf: an action's process must not start now)."""
        return self.left(tx) - ACTION_MARGIN * self.ttl

    def keep(self, stop: threading.Event) -> None:
        """The lease thread: renew every ttl/4 until `stop`."""
        while not stop.is_set():
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - keep the authority alive; log and retry
                log.exception("lease renewal failed")
                self.holding.clear()
            stop.wait(self.ttl / 4)


@dataclass(frozen=True)
class Observed:
    """The lease as anyone reading the state sees it (the API, the status page, /metrics)."""

    holder: str
    epoch: int
    seconds_left: float | None     # on the lease's clock; None: another boot's monotonic clock (SQLite)
    clock: str                     # "database" (PostgreSQL) or "host" (SQLite: the holder's monotonic clock)

    def as_dict(self) -> dict[str, object]:
        left = None if self.seconds_left is None else round(self.seconds_left, 1)
        return {"holder": self.holder, "epoch": self.epoch, "seconds_left": left, "clock": self.clock,
                "leading": left is not None and left >= 0}


def shown(store: Reads) -> dict[str, object] | None:
    """`observed()` as the API and the status page show it (None: nobody ever took the lease)."""
    seen = observed(store)
    return None if seen is None else seen.as_dict()


def observed(store: Reads) -> Observed | None:
    """Who holds the authority's lease and how long it has left (None: nobody ever took it)."""
    row = store.lease(NAME)
    if row is None:
        return None
    shared = store.lease_clock()
    if shared is not None:
        return Observed(row.holder, row.epoch, row.expires_at - shared[0], "database")
    left = row.expires_at - time.monotonic() if row.boot == boot_id() else None
    return Observed(row.holder, row.epoch, left, "host")
