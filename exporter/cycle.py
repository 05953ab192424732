"""One cycle over the fleet: concurrent readings, verdicts, probes for idle backends.

* Every backend is read in a thread pool with its own timeout; the cycle waits at most
  `read_timeout` for the answers, so a hung backend delays nobody: it is judged "timeout" this
  cycle and its read stays in flight (never two reads of one backend at once).
* Every read is timestamped when it completes. A read that completed before the current cycle
  started (it finished after an earlier cycle stopped waiting) is stale: it is dropped, not judged
  and not counted, and a new read starts. Only a reading younger than `read_timeout` may allow a probe.
* A /metrics timeout when the last reading showed no work counts toward down only when /health
  fails or times out too: /health is asked alongside the read after a timeout, or right after the
  wait for a first timeout (the cycle then waits up to `read_timeout` once more).
* Probes run in their own pool and never block a cycle; a finished probe's result is judged in the
  next cycle. At most one probe in flight per backend, at most one per `max(interval, probe_every)`,
  and only after a fresh reading that shows no work. Probes are counted when sent (`probes_sent`)
  and again by result when they finish.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llm_health.exporter.backend import Target, health_ok, observe, proxy_up
from llm_health.exporter.probe import Prober
from llm_health.exporter.verdict import (
    PROBE_RESULTS,
    READ_OK,
    READ_RESULTS,
    READ_TIMEOUT,
    BackendState,
    Observation,
    ProbeResult,
    Thresholds,
    Verdict,
    judge,
)

from llm_health.config import Backend, ExporterSettings, Proxy

T = TypeVar("T")


def _timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """Call `fn` and note when it completed (time.monotonic()): the age of what it learned."""
    result = fn(*args)
    return result, time.monotonic()


@dataclass
class BackendSlot:
    backend: Backend
    target: Target
    prober: Prober
    state: BackendState
    health_target: Target | None = None
    read: Future[tuple[Observation, float]] | None = None       # (observation, completed at, monotonic)
    health: Future[tuple[bool, float]] | None = None           # /health asked after a timeout
    last_outcome: str = ""                                     # READ_* of the last judged read
    probe: Future[ProbeResult] | None = None
    last_probe_cycle: float | None = None      # scheduled start of the cycle that sent the last probe
    readings: dict[str, int] = field(default_factory=lambda: dict.fromkeys(READ_RESULTS, 0))
    probes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROBE_RESULTS, 0))
    probes_sent: int = 0


@dataclass
class ProxySlot:
    proxy: Proxy
    target: Target
    check: Future[bool] | None = None
    up: bool | None = None


@dataclass(frozen=True)
class BackendView:
    """What the service shows of one backend (a snapshot, safe to read from any thread)."""

    name: str
    url: str
    verdict: Verdict
    reason: str
    since: float
    in_flight: float
    tokens_per_second: float
    last_progress: float | None
    readings: dict[str, int]
    probes: dict[str, int]
    probes_sent: int
    steps_per_second: float = 0.0


@dataclass(frozen=True)
class ProxyView:
    name: str
    url: str
    up: bool | None


@dataclass(frozen=True)
class Snapshot:
    backends: tuple[BackendView, ...] = ()
    proxies: tuple[ProxyView, ...] = ()
    cycle_seconds: float = 0.0
    cycles: int = 0
    at: float = 0.0


class Fleet:
    """All configured backends and proxies, and the loop that judges them."""

    def __init__(
        self,
        backends: Sequence[Backend],
        proxies: Sequence[Proxy],
        settings: ExporterSettings,
        clock: Callable[[], float] = time.time,
        api_key: str = "",
        dynamic: bool = False,
    ) -> None:
        self.settings = settings
        self.thresholds = Thresholds.from_settings(settings)
        self.clock = clock
        self.api_key = api_key
        now = clock()
        self.backends = [self._slot(b, now) for b in backends]
        self._wanted: tuple[Backend, ...] | None = None     # set_backends(): applied at the next cycle
        self.proxies = [ProxySlot(p, Target(p.url, settings.read_timeout, api_key)) for p in proxies]
        # with a backend list that changes at run time (discovery) the pools are sized for a big fleet
        # (threads start lazily, so unused room costs nothing)
        n = 512 if dynamic else len(self.backends) + len(self.proxies)
        # a hung backend can hold two threads (its read and its /health check)
        self._reads = ThreadPoolExecutor(max_workers=max(4, min(512, 2 * n)), thread_name_prefix="read")
        self._probes = ThreadPoolExecutor(max_workers=64 if dynamic else max(2, min(64, len(self.backends))),
                                          thread_name_prefix="probe")
        self._lock = threading.Lock()
        self._snapshot = Snapshot(at=now)
        self._publish(0.0, 0)

    def _slot(self, b: Backend, now: float) -> BackendSlot:
        s = self.settings
        return BackendSlot(
            backend=b,
            target=Target(b.url, s.read_timeout, self.api_key),
            prober=Prober(b.url, s.probe_timeout, s.probe_model or b.model, self.api_key),
            state=BackendState(since=now),
            health_target=Target(b.url, s.read_timeout),
        )

    # ---- the backend set at run time (discovery) --------------------------------------------
    def set_backends(self, backends: Sequence[Backend]) -> None:
        """The backends to watch from the next cycle on (any thread may call this). A backend whose
        name and URL are unchanged keeps its state and counters; a new or moved one starts afresh
        (unknown until read); a missing one is dropped (its in-flight read is simply not waited for)."""
        with self._lock:
            self._wanted = tuple(backends)

    def _apply_wanted(self) -> None:
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if wanted is None:
            return
        old = {(s.backend.name, s.backend.url): s for s in self.backends}
        now = self.clock()
        slots = []
        for b in wanted:
            slot = old.get((b.name, b.url))
            if slot is None:
                slot = self._slot(b, now)
            else:
                slot.backend = b            # host/model/restart may have changed; the reading state stays
            slots.append(slot)
        self.backends = slots

    # ---- one cycle -------------------------------------------------------------------------
    def run_cycle(self, scheduled: float | None = None) -> float:
        """Read, judge, maybe probe; returns the cycle's duration in seconds."""
        self._apply_wanted()
        started = time.monotonic()
        scheduled = started if scheduled is None else scheduled
        pending: list[Future] = []
        for slot in self.backends:
            self._drop_stale(slot, started)
            if slot.read is None:
                slot.read = self._reads.submit(_timed, observe, slot.target)
            pending.append(slot.read)
            if slot.last_outcome == READ_TIMEOUT and self._timeout_needs_health(slot):
                pending.append(self._ask_health(slot))
        for pslot in self.proxies:
            if pslot.check is None:
                pslot.check = self._reads.submit(proxy_up, pslot.target)
            pending.append(pslot.check)
        wait(pending, timeout=self.settings.read_timeout + 0.05)
        # a first timeout after a reading without work: ask /health now, it decides whether it counts
        late = [self._ask_health(slot) for slot in self.backends
                if slot.read is not None and not slot.read.done() and self._timeout_needs_health(slot)]
        if late:
            wait(late, timeout=self.settings.read_timeout + 0.05)
        now = self.clock()
        for slot in self.backends:
            self._judge(slot, now, scheduled, started)
        for pslot in self.proxies:
            if pslot.check is not None and pslot.check.done():
                pslot.up = bool(pslot.check.result())
                pslot.check = None
            elif pslot.check is not None:
                pslot.up = False  # no answer within the read timeout
        duration = time.monotonic() - started
        self._publish(duration, self._snapshot.cycles + 1)
        return duration

    @staticmethod
    def _drop_stale(slot: BackendSlot, started: float) -> None:
        """A read or /health answer that completed before this cycle started is not used: start afresh."""
        for name in ("read", "health"):
            fut: Future[tuple[Any, float]] | None = getattr(slot, name)
            if fut is None or not fut.done():
                continue
            try:
                completed = fut.result()[1]
            except Exception:  # noqa: BLE001 - a failed read is dropped as well
                completed = float("-inf")
            if completed < started:
                setattr(slot, name, None)

    @staticmethod
    def _timeout_needs_health(slot: BackendSlot) -> bool:
        """A /metrics timeout counts toward down only after a reading without work (or none at all)."""
        last = slot.state.last
        return last is None or last.work <= 0

    def _ask_health(self, slot: BackendSlot) -> Future[tuple[bool, float]]:
        """At most one /health check in flight per backend (its own connection: the read may hang)."""
        if slot.health is None:
            if slot.health_target is None:
                slot.health_target = Target(slot.backend.url, self.settings.read_timeout)
            slot.health = self._reads.submit(_timed, health_ok, slot.health_target)
        return slot.health

    def _judge(self, slot: BackendSlot, now: float, scheduled: float, started: float | None = None) -> None:
        started = time.monotonic() if started is None else started
        read = slot.read
        completed: float | None = None
        if read is not None and read.done():
            slot.read = None
            try:
                obs, completed = read.result()
            except Exception as exc:  # noqa: BLE001 - never let one backend break the cycle
                obs = Observation(outcome="error", detail=f"{type(exc).__name__}: {exc}")
        else:
            obs = Observation(outcome=READ_TIMEOUT,
                              detail=f"no answer within {self.settings.read_timeout:g} s")
        health = slot.health
        if health is not None and health.done():
            slot.health = None
            if obs.outcome == READ_TIMEOUT:
                try:
                    fine, _at = health.result()
                except Exception:  # noqa: BLE001
                    fine = False
                obs = Observation(outcome=obs.outcome, detail=obs.detail, cheap_ok=fine)
        elif health is not None and obs.outcome == READ_TIMEOUT:
            # /health did not answer within the wait either
            obs = Observation(outcome=obs.outcome, detail=obs.detail, cheap_ok=False)
        probe = slot.probe
        if probe is not None and probe.done():
            slot.probe = None
            try:
                result = probe.result()
            except Exception as exc:  # noqa: BLE001
                result = ProbeResult("error", f"{type(exc).__name__}: {exc}")
            slot.probes[result.result] = slot.probes.get(result.result, 0) + 1
            obs = Observation(outcome=obs.outcome, reading=obs.reading, detail=obs.detail,
                              cheap_ok=obs.cheap_ok, probe=result)
        slot.readings[obs.outcome] = slot.readings.get(obs.outcome, 0) + 1
        slot.last_outcome = obs.outcome
        slot.state = judge(slot.state, obs, now, self.thresholds)
        fresh = completed is not None and completed >= started and \
            time.monotonic() - completed <= self.settings.read_timeout
        if fresh and self._may_probe(slot, obs, scheduled):
            slot.last_probe_cycle = scheduled
            slot.probes_sent += 1
            slot.probe = self._probes.submit(slot.prober.probe)

    def _may_probe(self, slot: BackendSlot, obs: Observation, scheduled: float) -> bool:
        """Only after a fresh reading with no work, one at a time, at most once per probe gap."""
        reading = obs.reading
        if obs.outcome != READ_OK or reading is None or not reading.has_engine_metrics or reading.work > 0:
            return False
        if slot.probe is not None:
            return False
        gap = max(self.settings.interval, self.settings.probe_every)
        return slot.last_probe_cycle is None or scheduled - slot.last_probe_cycle >= gap - 1e-6

    # ---- the loop --------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event) -> None:
        """Fixed-rate cycles every `interval` seconds until `stop` is set (an overrun skips ahead)."""
        interval = max(self.settings.interval, 0.01)
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.run_cycle(scheduled=next_at)
            except Exception:  # noqa: BLE001 - a bug in one cycle must not end the loop
                traceback.print_exc(file=sys.stderr)
            next_at += interval
            now = time.monotonic()
            if next_at < now:
                next_at = now  # overran: start the next cycle at once, probes still spaced by `gap`
            stop.wait(next_at - now)

    def close(self) -> None:
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)

    # ---- what the service shows ------------------------------------------------------------
    def _publish(self, duration: float, cycles: int) -> None:
        backends = tuple(
            BackendView(
                name=s.backend.name,
                url=s.backend.url,
                verdict=s.state.verdict,
                reason=s.state.reason,
                since=s.state.since,
                in_flight=s.state.in_flight,
                tokens_per_second=s.state.tokens_per_second,
                last_progress=s.state.last_progress,
                readings=dict(s.readings),
                probes=dict(s.probes),
                probes_sent=s.probes_sent,
                steps_per_second=s.state.steps_per_second,
            )
            for s in self.backends
        )
        proxies = tuple(ProxyView(p.proxy.name, p.proxy.url, p.up) for p in self.proxies)
        with self._lock:
            self._snapshot = Snapshot(backends, proxies, duration, cycles, self.clock())

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot
