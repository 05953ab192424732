"""What every step is given: the explicit context of one authority (no step keeps state of its own).

`Context` holds the store, the configuration, the backend I/O, the clocks, who we are (the lease holder
and how to check that we still are, inside a transaction), where the action files go, and the registry
of restart actions running in this process. The authority builds one and shares it with every part
(reconciler, recovery, lifecycle watch), so a test that swaps the configuration or a check does it once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from llm_health.config import Config, RemediatorSettings
from llm_health.remediator import policy
from llm_health.remediator.backend_io import BackendIO
from llm_health.remediator.clock import Clocks
from llm_health.remediator.store import Reads, StateStore, Transaction


class RunningActions:
    """Restart actions whose argv runs in this process now (action id -> backend)."""

    def __init__(self) -> None:
        self._running: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, action_id: int, backend: str) -> None:
        with self._lock:
            self._running[action_id] = backend

    def remove(self, action_id: int) -> None:
        with self._lock:
            self._running.pop(action_id, None)

    def __contains__(self, action_id: object) -> bool:
        with self._lock:
            return action_id in self._running

    def backends(self) -> set[str]:
        with self._lock:
            return set(self._running.values())


def _no_hook() -> None:
    return None


class NotLeading(RuntimeError):
    """The authority's lease is not ours in the term this look began in: the transaction wrote nothing."""


@dataclass
class Context:
    store: StateStore
    config: Config
    io: BackendIO
    clocks: Clocks
    holder: str
    holds_lease: Callable[[Reads], bool]           # in the caller's transaction (or a read), in the look's term
    spare_to_act: Callable[[Reads], float]         # ... seconds until too little of it is left to start a process
    epoch: Callable[[], int]                       # the lease's term the look acts for (LLM_HEALTH_EPOCH)
    action_dir: Path | None = None                 # where the default runner's files go
    diagnostics_dir: Path | None = None            # where diagnostics captures may keep files (one folder each)
    running: RunningActions = field(default_factory=RunningActions)
    #: a restart was aborted and its abort could not be recorded: recover() must run again
    on_abort_unrecorded: Callable[[], None] = _no_hook

    @contextmanager
    def fenced(self) -> Iterator[Transaction]:
        """A write transaction of the authority's: the lease is checked first, inside it (ours, in the term
        the look began in), so a holder deposed meanwhile (frozen, cut off, its renewals failing, or holding
        a newer term than the look's) writes nothing: NotLeading, and the transaction is rolled back."""
        with self.store.tx() as tx:
            self.check_leading(tx)
            yield tx

    def check_leading(self, rd: Reads) -> None:
        """NotLeading unless the lease, read from `rd` (a transaction, or the store itself for a side effect
        outside any transaction), is ours in the term the look began in."""
        if not self.holds_lease(rd):
            raise NotLeading(f"{self.holder} does not hold the authority's lease in term {self.epoch()}: "
                             "nothing recorded")

    @property
    def r(self) -> RemediatorSettings:
        return self.config.remediator

    @property
    def settings(self) -> policy.Settings:
        r = self.r
        return policy.Settings(backoff=r.backoff, budget=r.budget, breaker=r.breaker,
                               unknown_retry=max(r.verify_interval, r.poll_interval),
                               unresponsive_after=r.unresponsive_after)

    @property
    def busy_dir(self) -> Path | None:
        return self.config.resolve_path(self.r.busy_dir) if self.r.busy_dir else None

    def sample_gap(self) -> float:
        """Two `unresponsive` verifications further apart than this are not one unbroken run: about two
        verifications (each reading and its /health check at their deadlines) plus a retry and a poll."""
        r = self.r
        span = (max(2, r.verify_readings) - 1) * r.verify_interval + \
            max(2, r.verify_readings) * 2 * self.config.exporter.read_timeout
        return 2 * span + self.settings.unknown_retry + r.poll_interval
