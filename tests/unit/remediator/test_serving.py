"""remediator/serving.py: the worker that holds the authority leaves a new connection to the others a moment."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from gunicorn.workers.gthread import ThreadWorker

from llm_health.remediator import serving
from llm_health.remediator.buffering import Buffering, ServingLimits
from llm_health.remediator.serving import YIELD_FOR, GuardedThreadWorker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Any:
    clock = Clock()
    monkeypatch.setattr(serving, "time", clock)
    w = GuardedThreadWorker.__new__(GuardedThreadWorker)      # the loop's state only, no sockets
    w.cfg = SimpleNamespace(workers=2)
    w.limits = ServingLimits()
    w.reading, w.accept_paused_until, w.next_sweep = {}, 0.0, float("inf")
    w.yielding, w.taking_until = False, 0.0
    w.holding, w.waiting = True, True          # holds the lease; a connection waits in the listener's backlog
    w.leads = lambda: w.holding
    w.sockets = ["listener"]
    w.accepted, w.enabled, w.clock = [], [], clock
    monkeypatch.setattr(serving.select, "select", lambda r, w_, x, t: (r if w.waiting else [], [], []))
    monkeypatch.setattr(Buffering, "accept", lambda self, listener: self.accepted.append(listener))
    monkeypatch.setattr(ThreadWorker, "set_accept_enabled", lambda self, on: self.enabled.append(on))
    return w


def back(worker: Any) -> None:
    """gthread's loop, YIELD_FOR later: accepting again, if the pause is over."""
    worker.clock.t += YIELD_FOR
    worker.set_accept_enabled(True)


def test_it_leaves_a_new_connection_to_the_others_then_takes_it_if_nobody_did(worker: Any) -> None:
    worker.accept("listener")
    assert worker.accepted == [] and worker.enabled == [False]
    assert worker.accept_paused_until == worker.next_sweep == 100.0 + YIELD_FOR
    worker.clock.t += YIELD_FOR / 2
    worker.set_accept_enabled(True)                       # gthread's loop asks again: still paused
    assert worker.enabled[-1] is False
    back(worker)
    assert worker.enabled[-1] is True
    worker.accept("listener")                              # still waiting in the backlog: nobody else took it
    worker.accept("listener")                              # ... nor the one behind it: it takes what waits
    assert worker.accepted == ["listener", "listener"]
    worker.waiting = False                                 # all taken
    worker.accept("listener")
    worker.waiting = True                                  # the next arrival is left to the others again
    worker.accept("listener")
    assert worker.accepted == ["listener"] * 3 and worker.enabled[-1] is False


def test_one_the_others_took_meanwhile_is_not_mistaken_for_one_they_cannot_take(worker: Any) -> None:
    worker.accept("listener")
    worker.waiting = False                                 # another worker took it
    back(worker)
    worker.waiting = True                                  # a new one arrives just after: left to the others
    worker.accept("listener")
    assert worker.accepted == [] and worker.enabled[-1] is False


@pytest.mark.parametrize("holding, workers", [(False, 2), (True, 1)])
def test_a_worker_without_the_authority_or_alone_accepts_at_once(worker: Any, holding: bool, workers: int) -> None:
    worker.holding, worker.cfg.workers = holding, workers
    worker.accept("listener")
    assert worker.accepted == ["listener"] and worker.enabled == []
