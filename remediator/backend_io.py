"""The authority's I/O towards one backend, injectable: the checks a step calls and the action runner.

Tests script these; the defaults (authority.py) read the backend with the exporter's code and run the
restart argv through action.py's wrapper.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_health.exporter.observation import Verification
from llm_health.remediator import action as act
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.store import StateStore

from llm_health.config import Backend

log = logging.getLogger("llm_health.remediator")

VERIFY = "verify"              # probe purposes (llm_health_remediator_probes_total{purpose})
WARMUP = "warmup"

Verifier = Callable[[Backend], Verification]
WarmupCheck = Callable[[Backend], tuple[bool, str]]  # -> (ready, why)
InFlightReader = Callable[[Backend], InFlight]
Runner = Callable[[Sequence[str], float, dict[str, str]], act.ActionResult]


@dataclass
class BackendIO:
    verifier: Verifier
    warmup_check: WarmupCheck
    answer_check: WarmupCheck
    in_flight: InFlightReader
    runner: Runner


#: while set (per thread), every idle probe exporter.check sends is appended here (counted afterwards)
probe_log: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("probe_log", default=None)


def probing(store: StateStore, backend: Backend, purpose: str, check: Callable[[Backend], Any]) -> Any:
    """Run a verifier / warm-up check and count the probes it sent (`probes` counters in the store)."""
    sink: list[str] = []
    token = probe_log.set(sink)
    try:
        return check(backend)
    finally:
        probe_log.reset(token)
        if sink:
            try:
                with store.tx() as tx:
                    tx.bump("probes", f"{backend.name}\t{purpose}", len(sink))
            except Exception:  # noqa: BLE001 - counting must never stop the restart procedure
                log.exception("could not count %d probe(s) to %s", len(sink), backend.name)
