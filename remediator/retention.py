"""Retention: prune old events, finished actions and closed incidents (remediator.retention).

Restart history inside the budget, breaker and backoff windows is never pruned (the restart policy
reads it); the restarts counters keep counting what was pruned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from llm_health.config import Config
from llm_health.remediator.store import StateError, StateStore

log = logging.getLogger(__name__)


def protected_window(config: Config) -> float:
    r = config.remediator
    return max(r.budget.window, r.breaker.window, r.backoff.stable_after, r.backoff.cap) + r.action_timeout


def prune(store: StateStore, config: Config, now: float) -> dict[str, int]:
    ret = config.remediator.retention
    with store.tx() as tx:
        return tx.prune(now, max_age=ret.max_age, max_events=ret.max_events, max_actions=ret.max_actions,
                        protect=protected_window(config))


class Pruner:
    def __init__(self, store: StateStore, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.store, self.config, self.clock = store, config, clock
        self._stop = threading.Event()

    def start(self) -> Pruner:
        threading.Thread(target=self._loop, name="remediator-retention", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.remediator.retention.interval):
            try:
                done = prune(self.store, self.config, self.clock())
                if any(done.values()):
                    log.info("retention pruned %s", done)
            except StateError as exc:
                log.error("retention stopped: %s", exc)
                return
            except Exception:  # noqa: BLE001 - pruning is housekeeping; never kill the worker
                log.exception("retention prune failed")
