"""Every backend on its own clock: one scheduler thread, a heap of per-backend deadlines, a worker pool.

* **Schedule.** Each backend is read every `interval` seconds at its own phase (a fraction of the
  interval hashed from its name), so a big fleet is read evenly over the interval, not in one burst.
  Schedules and deadlines use the monotonic clock; the wall clock is only for exported timestamps.
* **One read at a time.** A backend never has two reads in flight: when its next read is due while
  the previous one still runs (a hung server holds it until the socket timeout), that read is skipped
  and counted (`reads_skipped`), not queued.
* **Judged on its own.** A backend is judged the moment its read completes, or when its own deadline
  passes (`read_timeout` after the read started in a worker): then the read is a timeout. A read
  that completes after that is dropped, never judged late. Nothing waits for another backend.
* **/health after a timeout, per backend.** A /metrics timeout after a reading without work counts
  toward down only when /health fails too: /health is asked (its own connection) when the read's
  deadline passes, or alongside the read when the previous read timed out too; the timeout is judged
  when /health answers or its own deadline passes.
* **Probes.** Right after a fresh reading that shows no work, at most one probe in flight per backend
  and at most one per `max(interval, probe_every)` (measured between the scheduled times of the
  readings that sent them). A finished probe's result is judged with the backend's next reading.
  Probes are counted when sent (`probes_sent`) and by result when they finish. The fleet's probes share
  one pool: a probe goes out only while the idle page it was decided on is still the backend's latest
  and fresh (else it is not sent: `probes["not_sent"]`), so one that waited behind hung servers' probes
  never reaches a server that took work meanwhile.
* **Threads.** The scheduler thread owns all backend state (a probe worker reads it and counts its own
  probe); workers only do I/O and then post the
  backend to the scheduler's queue. Every exchange has a total deadline (llm_health/http_client.py),
  so a worker is held for at most its timeout, even by a server that drips its answer.
* **Lanes: no group of backends can take the readers over.** Reads and /health checks run in two
  bounded lanes (exporter/pool.py): `steady` for backends whose last reading came back in time (within
  half the read timeout), `suspect` for the others (timeouts, slow answers, never read yet). Within a
  lane, one host:port holds at most `max_reads_per_endpoint` workers, and a freed worker goes to the
  next host:port in turn. So 300 dripping or hung servers wait behind each other in the suspect lane,
  never in front of a healthy backend. A read waiting for a worker is lag, not a timeout: its deadline
  counts from when it starts; the schedule lag includes reads still waiting, and each backend's last
  judged reading is exported with its time (`llm_health_last_reading_timestamp_seconds`), so a backend
  that is not judged for several intervals is visible and alerted on.
* **Changing fleet.** `set_backends()` and `set_proxies()` add, replace and remove backends and proxies while
  the loop runs (discovery, a config reload); `update_settings()` takes new thresholds.

`read_all()` reads every backend once right now and returns when each is judged: the scheduler's work
done synchronously (tests, benchmarks). Do not use it while `run_forever()` runs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from llm_health.config import Backend, ExporterSettings, Proxy
from llm_health.exporter.backend import MODELS, Target, answers, observe
from llm_health.exporter.observation import Observation, ProbeOutcome, ProbeResult, ReadResult
from llm_health.exporter.pool import Lane
from llm_health.exporter.probe import Prober
from llm_health.exporter.verdict import (
    BackendState,
    Thresholds,
    Verdict,
    idle_believable,
    judge,
    may_probe_engine,
    page_is_work_queue,
    progress_signature,
)

READ_WORKERS = 256       # reads, /health checks and proxy checks in flight at once, per lane
PROBE_WORKERS = 64       # probes in flight at once, whole fleet
#: probes.get(NOT_SENT): probes that waited in the pool past their idle page and were never sent
NOT_SENT = "not_sent"
SLACK = 0.05             # a read's deadline: read_timeout after it started, plus this
# verdict changes between these two are routine (every burst of requests): logged at DEBUG only
ROUTINE = frozenset({Verdict.IDLE, Verdict.BUSY})

log = logging.getLogger("llm_health.exporter")


class Job:
    """One call in a worker thread; the worker notes when it started and finished (monotonic)."""

    def __init__(self, lane: Lane, key: str, fn: Callable[..., Any], *args: Any,
                 notify: Callable[[], None], due: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.due = due                      # when it was scheduled to start
        self.clock = clock
        self.submitted = clock()
        self.started: float | None = None
        self.finished: float | None = None
        self.future: Future[Any] = lane.submit(key, self._run, fn, *args)
        self.future.add_done_callback(lambda _f: notify())

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.started = self.clock()
        try:
            return fn(*args)
        finally:
            self.finished = self.clock()

    def done(self) -> bool:
        return self.future.done()

    def deadline(self, timeout: float) -> float | None:
        """When it is late (`timeout` after it started); None while it waits for a worker."""
        return None if self.started is None else self.started + timeout + SLACK


@dataclass(frozen=True)
class BackendView:
    """What the service shows of one backend (a snapshot, safe to read from any thread)."""

    name: str
    url: str
    verdict: Verdict
    reason: str
    since: float                          # wall clock
    in_flight: float
    tokens_per_second: float
    last_progress: float | None           # wall clock
    readings: dict[str, int]
    probes: dict[str, int]
    probes_sent: int
    steps_per_second: float = 0.0
    reads_skipped: int = 0
    read_seconds: float = 0.0             # how long the last judged read took (the timeout when it timed out)
    lag_seconds: float = 0.0              # how late the last read started after its scheduled time
    last_reading: float | None = None     # wall clock of its last judged reading (None: never judged)
    stall_bound: float = 0.0              # how long its counters may stay frozen with work (exporter/steptime.py)
    progress_signature: str = ""          # stalled only: the frozen counters (verdict.progress_signature)
    page_is_work_queue: bool = False      # stalled only: its last page came from the inference loop (llama.cpp)


@dataclass
class BackendSlot:
    backend: Backend
    target: Target
    health_target: Target
    prober: Prober
    state: BackendState
    phase: float = 0.0                         # offset of its readings within the interval
    next_due: float = 0.0                      # monotonic time of the next scheduled read
    read: Job | None = None                    # the read in flight (or finished, not yet cleared)
    judged: bool = True                        # the current read has been judged (maybe as a timeout)
    health: Job | None = None                  # /health asked after (or with) a timeout
    last_outcome: str = ""                     # READ_* of the last judged read
    probe: Future[ProbeResult] | None = None
    last_probe_due: float | None = None        # scheduled time of the read that sent the last probe
    readings: dict[str, int] = field(default_factory=lambda: dict.fromkeys(tuple(ReadResult), 0))
    probes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(tuple(ProbeOutcome), 0))
    probes_sent: int = 0
    reads_skipped: int = 0
    read_seconds: float = 0.0
    lag_seconds: float = 0.0
    judged_at: float = float("-inf")           # the verdict's `now` at its last judgement (monotonic)
    judgements: int = 0                        # judged readings so far (a probe goes out only if none since)
    view: BackendView | None = None


@dataclass
class ProxySlot:
    proxy: Proxy
    target: Target
    phase: float = 0.0
    next_due: float = 0.0
    check: Job | None = None
    judged: bool = True
    up: bool | None = None


@dataclass(frozen=True)
class ProxyView:
    name: str
    url: str
    up: bool | None


@dataclass(frozen=True)
class Snapshot:
    backends: tuple[BackendView, ...] = ()
    proxies: tuple[ProxyView, ...] = ()
    cycles: int = 0                 # whole intervals since the loop started
    lag_seconds: float = 0.0        # the largest schedule lag: last reads, and reads still waiting for a worker
    at: float = 0.0                 # wall clock
    interval: float = 0.0           # seconds between two readings of one backend (the setting)


def phase_of(name: str, interval: float) -> float:
    """A stable offset in [0, interval) for `name`: spreads the fleet's readings over the interval."""
    return zlib.crc32(name.encode()) / 2**32 * interval


Slot = BackendSlot | ProxySlot


class ReadScheduler:
    """All watched backends and proxies, each on its own schedule, and the scheduler that runs them."""

    def __init__(
        self,
        backends: Sequence[Backend],
        proxies: Sequence[Proxy],
        settings: ExporterSettings,
        clock: Callable[[], float] = time.time,
        api_key: str = "",
        monotonic: Callable[[], float] = time.monotonic,
        dynamic: bool = False,              # the set changes at run time (discovery); the pools are bounded
    ) -> None:                              # and start threads lazily, so they need no resizing for it
        self.settings = settings
        self.thresholds = Thresholds.from_settings(settings)
        self.clock = clock                  # wall clock: exported timestamps only
        self.monotonic = monotonic          # schedules, deadlines, the verdict's `now`
        self.api_key = api_key
        self.interval = max(settings.interval, 0.01)
        per_endpoint = max(1, settings.max_reads_per_endpoint)
        self._steady = Lane(READ_WORKERS, per_endpoint, "read")
        self._suspect = Lane(READ_WORKERS, per_endpoint, "read-suspect")
        self._probes = ThreadPoolExecutor(max_workers=PROBE_WORKERS, thread_name_prefix="probe")
        self._lock = threading.RLock()      # held by the scheduler while it works, and by set_backends
        self._events: queue.SimpleQueue[Slot] = queue.SimpleQueue()   # slots whose job finished
        self._heap: list[tuple[float, int, Slot]] = []                # (when, seq, slot): look again then
        self._seq = itertools.count()
        self._slots: dict[str, BackendSlot] = {}
        self._proxies: dict[str, ProxySlot] = {}
        self._started: float | None = None    # monotonic start of run_forever
        self._closed = False
        self._to_wall = clock() - monotonic()  # monotonic -> wall for exported times (follows clock steps)
        self.set_backends(backends)
        self.set_proxies(proxies)

    # ---- the fleet -------------------------------------------------------------------------
    @property
    def backends(self) -> list[BackendSlot]:
        with self._lock:
            return list(self._slots.values())

    def set_backends(self, backends: Iterable[Backend]) -> None:
        """Watch exactly these backends from now on (any thread may call this). A backend whose name and
        URL are unchanged keeps its state, counters and schedule (its host, model or restart may change);
        a new or moved one starts afresh on its own schedule (unknown until read); a missing one is
        forgotten (a read of its still in flight is dropped)."""
        wanted = {b.name: b for b in backends}
        with self._lock:
            for name in [n for n, s in self._slots.items() if n not in wanted or wanted[n].url != s.backend.url]:
                self._forget(self._slots.pop(name))
            for name, b in wanted.items():
                slot = self._slots.get(name)
                if slot is not None:
                    slot.backend = b
                    slot.prober.configured = self.settings.probe_model or b.model
                    continue
                self._slots[name] = slot = self._new_slot(b)
                if self._started is not None:
                    self._start_schedule(slot, self.monotonic())

    def set_proxies(self, proxies: Iterable[Proxy]) -> None:
        """Check exactly these proxies from now on: one whose name and URL are unchanged keeps its state and
        schedule, a new or moved one starts afresh (unknown until checked), a missing one is forgotten."""
        wanted = {p.name: p for p in proxies}
        with self._lock:
            for name in [n for n, s in self._proxies.items() if n not in wanted or wanted[n].url != s.proxy.url]:
                gone = self._proxies.pop(name)
                if gone.check is None or gone.check.done():
                    gone.target.close()
            for name, p in wanted.items():
                if name in self._proxies:
                    continue
                slot = ProxySlot(p, Target(p.url, self.settings.read_timeout, self.api_key),
                                 phase=phase_of("proxy/" + p.name, self.interval))
                self._proxies[name] = slot
                if self._started is not None:
                    self._start_schedule(slot, self.monotonic())

    def update_settings(self, settings: ExporterSettings) -> None:
        """The settings a running fleet can take (exporter/reload.py LIVE_SETTINGS): the verdict's thresholds
        (stall_after, stall_ceiling, down_after) from the next judgement on, the probe gap and model from the
        next probe on. The others (interval, timeouts, api key, lanes) are fixed for the scheduler's life."""
        with self._lock:
            self.settings = settings
            self.thresholds = Thresholds.from_settings(settings)
            for slot in self._slots.values():
                slot.prober.configured = settings.probe_model or slot.backend.model

    def add_backend(self, backend: Backend) -> None:
        with self._lock:
            self.set_backends([*(s.backend for s in self._slots.values() if s.backend.name != backend.name),
                               backend])

    def remove_backend(self, name: str) -> None:
        with self._lock:
            self.set_backends([s.backend for s in self._slots.values() if s.backend.name != name])

    @staticmethod
    def _forget(slot: BackendSlot) -> None:
        """Close a removed backend's idle connections (one still in use is dropped when its read ends)."""
        if slot.read is None:
            slot.target.close()
        if slot.health is None or slot.health.done():
            slot.health_target.close()
        if slot.probe is None or slot.probe.done():
            slot.prober.close()

    def _new_slot(self, b: Backend) -> BackendSlot:
        s = self.settings
        slot = BackendSlot(
            backend=b,
            target=Target(b.url, s.read_timeout, self.api_key),
            health_target=Target(b.url, s.read_timeout),
            prober=Prober(b.url, s.probe_timeout, s.probe_model or b.model, self.api_key),
            state=BackendState(since=self.monotonic()),
            phase=phase_of(b.name, self.interval),
        )
        self._publish(slot)
        return slot

    # ---- the scheduler loop ----------------------------------------------------------------
    def run_forever(self, stop: threading.Event) -> None:
        """Read every backend on its own schedule until `stop` is set."""
        with self._lock:
            now = self.monotonic()
            self._started = now
            for slot in [*self._slots.values(), *self._proxies.values()]:
                self._start_schedule(slot, now)
        while not stop.is_set() and not self._closed:
            try:
                self._pump(max_wait=0.2)
            except Exception:  # noqa: BLE001 - a bug must not end the loop
                log.exception("the read scheduler's loop failed (it goes on)")

    def _start_schedule(self, slot: Slot, now: float) -> None:
        slot.next_due = now + slot.phase
        self._at(slot.next_due, slot)

    def _at(self, when: float, slot: Slot) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), slot))

    def _pump(self, max_wait: float) -> None:
        """Wait for a finished job or the next deadline (at most `max_wait` s), then handle all that is due."""
        with self._lock:
            next_at = self._heap[0][0] if self._heap else None
        wait = max_wait if next_at is None else min(max_wait, max(0.0, next_at - self.monotonic()))
        try:
            first: Slot | None = self._events.get(timeout=wait)
        except queue.Empty:
            first = None
        with self._lock:
            if self._closed:
                return
            ready = [] if first is None else [first]
            while True:
                try:
                    ready.append(self._events.get_nowait())
                except queue.Empty:
                    break
            now = self.monotonic()
            while self._heap and self._heap[0][0] <= now:
                ready.append(heapq.heappop(self._heap)[2])
            for slot in ready:
                if isinstance(slot, ProxySlot):
                    if self._proxies.get(slot.proxy.name) is slot:
                        self._tick_proxy(slot, now)
                elif self._slots.get(slot.backend.name) is slot:
                    self._tick(slot, now)

    # ---- one backend -----------------------------------------------------------------------
    def _tick(self, slot: BackendSlot, now: float) -> None:
        """Whatever is due for this backend now: settle its read, start the next one if it is time."""
        self._settle(slot)
        if self._started is not None and slot.next_due <= now:
            self._start_read(slot, slot.next_due)
            slot.next_due += self.interval
            while slot.next_due <= now:         # the scheduler itself fell behind: skip, never burst
                slot.next_due += self.interval
                slot.reads_skipped += 1
            self._at(slot.next_due, slot)

    def _start_read(self, slot: BackendSlot, due: float) -> None:
        if slot.read is not None:
            slot.reads_skipped += 1             # the previous read still runs: never two at once
            self._publish(slot)
            return
        notify = self._notifier(slot)
        slot.read = Job(self._lane(slot), slot.target.endpoint, observe, slot.target, notify=notify, due=due,
                        clock=self.monotonic)
        slot.judged = False
        if slot.last_outcome == ReadResult.TIMEOUT and self._timeout_needs_health(slot):
            self._ask_health(slot)              # timed out last time: ask /health alongside
        self._at(slot.read.submitted + self.settings.read_timeout + SLACK, slot)

    def _lane(self, slot: BackendSlot) -> Lane:
        """Steady when the last judged read answered within half the read timeout; suspect otherwise (a
        timeout, a slow answer, or never read): a misbehaving backend waits behind its own kind."""
        if slot.last_outcome in ("", ReadResult.TIMEOUT) or slot.read_seconds > self.settings.read_timeout / 2:
            return self._suspect
        return self._steady

    def _proxy_lane(self, p: ProxySlot) -> Lane:
        return self._steady if p.up else self._suspect

    def _notifier(self, slot: Slot) -> Callable[[], None]:
        return lambda: self._events.put(slot)

    def _settle(self, slot: BackendSlot) -> None:
        """Judge the current read once its outcome is known; otherwise look again at its deadline."""
        read = slot.read
        if read is None:
            return
        if slot.judged:
            if read.done():
                slot.read = None                # a late read: dropped, the next may start
            if slot.health is not None and slot.health.done():
                slot.health = None
            return
        now = self.monotonic()
        rt = self.settings.read_timeout
        if read.done():
            try:
                obs = read.future.result()
            except Exception as exc:  # noqa: BLE001 - never let one backend break the loop
                obs = Observation(outcome="error", detail=f"{type(exc).__name__}: {exc}")
        else:
            late = read.deadline(rt)
            if late is None or now < late:       # still waiting for a worker, or within its time
                self._at(now + rt if late is None else late, slot)
                return
            obs = Observation(outcome=ReadResult.TIMEOUT, detail=f"no answer within {rt:g} s")
        if obs.outcome == ReadResult.TIMEOUT and self._timeout_needs_health(slot):
            fine = self._health_answer(slot, now)
            if fine is None:
                return                           # /health still has time: judged when it answers
            obs = Observation(ReadResult.TIMEOUT, detail=obs.detail, cheap_ok=fine)
        if read.done():
            slot.read = None
        self._judge(slot, obs, read)

    def _health_answer(self, slot: BackendSlot, now: float) -> bool | None:
        """/health's answer for the current timeout: True/False, or None while it may still answer."""
        health = self._ask_health(slot)
        if health.done():
            slot.health = None
            return health.future.exception() is None and bool(health.future.result())
        late = health.deadline(self.settings.read_timeout)
        if late is None or now < late:
            self._at(now + self.settings.read_timeout if late is None else late, slot)
            return None
        return False                             # no answer within its own timeout

    @staticmethod
    def _timeout_needs_health(slot: BackendSlot) -> bool:
        """/health tells a slow page from a server that answers nothing: asked after every /metrics
        timeout except on llama.cpp with work last seen (there the hanging page is itself the evidence)."""
        last = slot.state.last
        return last is None or last.work <= 0 or not page_is_work_queue(last)

    def _ask_health(self, slot: BackendSlot) -> Job:
        """At most one /health check in flight per backend (its own connection: the read may hang).
        An answer older than the current read is not used: ask again."""
        h = slot.health
        stale = h is not None and h.done() and slot.read is not None and h.submitted < slot.read.submitted
        if h is None or stale:
            slot.health = Job(self._suspect, slot.health_target.endpoint, answers, slot.health_target,
                              notify=self._notifier(slot),
                              clock=self.monotonic)
        assert slot.health is not None
        return slot.health

    def _judge(self, slot: BackendSlot, obs: Observation, read: Job) -> None:
        slot.judged = True
        slot.judgements += 1
        now = self.monotonic()
        probe = slot.probe
        if probe is not None and probe.done():
            slot.probe = None
            try:
                result = probe.result()
            except Exception as exc:  # noqa: BLE001
                result = ProbeResult("error", f"{type(exc).__name__}: {exc}")
            if result is None:                  # it waited in the pool past its page: not sent
                slot.probes[NOT_SENT] = slot.probes.get(NOT_SENT, 0) + 1
            else:
                slot.probes[result.outcome] = slot.probes.get(result.outcome, 0) + 1
                obs = replace(obs, probe=result)
        slot.readings[obs.outcome] = slot.readings.get(obs.outcome, 0) + 1
        slot.last_outcome = obs.outcome
        started = read.started if read.started is not None else read.submitted
        at = max(self._taken(read, started, obs, now), slot.judged_at)   # never back in time
        slot.judged_at = at
        if obs.outcome != ReadResult.TIMEOUT and read.finished is not None and read.finished - at > SLACK:
            obs = replace(obs, answered=read.finished)   # a slow answer: its counters may be from then
        before = slot.state.verdict
        slot.state = judge(slot.state, obs, at, self.thresholds)
        if slot.state.verdict != before:
            log.log(logging.DEBUG if {before, slot.state.verdict} <= ROUTINE else logging.INFO,
                    "backend %s: %s -> %s: %s", slot.backend.name, before, slot.state.verdict, slot.state.reason)
        slot.lag_seconds = max(0.0, started - read.due) if read.due else 0.0
        slot.read_seconds = (read.finished if read.finished is not None else now) - started
        fresh = read.finished is not None and now - read.finished <= self.settings.read_timeout
        if fresh and self._may_probe(slot, obs, read.due):
            slot.last_probe_due = read.due
            slot.probe = self._probes.submit(self._probe_if_still_idle, slot, slot.judgements,
                                             now + self.settings.read_timeout)
        self._publish(slot)

    def _probe_if_still_idle(self, slot: BackendSlot, decided_at: int, admit_by: float) -> ProbeResult | None:
        """In a probe worker: the probe goes out (and is counted) only while the idle reading it was decided
        on is still the backend's latest judged one (no reading since, good or failed) and no older than a
        read timeout. Probes of the whole fleet share one pool: one that waited there behind others (hung
        servers' probes at probe_timeout) must not reach a server that has taken work since. None: not sent."""
        if slot.judgements != decided_at or self.monotonic() > admit_by:
            return None
        slot.probes_sent += 1          # this worker is its one writer; counted before it goes out (snapshot)
        return slot.prober.probe()

    @staticmethod
    def _taken(read: Job, started: float, obs: Observation, now: float) -> float:
        """The verdict's `now`: when the reading was taken. A read that started on time (within SLACK of
        its schedule) counts as taken at its scheduled time, so a backend's stall clock advances in
        whole intervals and a few ms of jitter never cost it an interval of detection. A timeout is
        judged when it was declared."""
        if obs.outcome == ReadResult.TIMEOUT:
            return now
        return read.due if 0.0 <= started - read.due <= SLACK else started

    def _may_probe(self, slot: BackendSlot, obs: Observation, due: float) -> bool:
        """Only after a fresh reading with no work, one at a time, at most once per probe gap."""
        reading = obs.reading
        if obs.outcome != ReadResult.OK or reading is None or not reading.has_engine_metrics or reading.work > 0:
            return False
        if not may_probe_engine(reading) or not idle_believable(slot.state, obs):
            return False
        if slot.probe is not None or slot.state.probe_unanswered:   # the last one may still be in its queue
            return False
        gap = max(self.settings.interval, self.settings.probe_every)
        return slot.last_probe_due is None or due - slot.last_probe_due >= gap - 1e-6

    # ---- one proxy -------------------------------------------------------------------------
    def _tick_proxy(self, p: ProxySlot, now: float) -> None:
        check = p.check
        if check is not None and check.done():
            p.check = None
            if not p.judged:
                p.up = not check.future.exception() and bool(check.future.result())
                p.judged = True
        elif check is not None and not p.judged:
            late = check.deadline(self.settings.read_timeout)
            if late is not None and now >= late:
                p.up, p.judged = False, True   # no answer within the read timeout
        if self._started is not None and p.next_due <= now:
            if p.check is None:
                p.check = Job(self._proxy_lane(p), p.target.endpoint, answers, p.target, MODELS,
                              notify=self._notifier(p), due=p.next_due,
                              clock=self.monotonic)
                p.judged = False
                self._at(now + self.settings.read_timeout + SLACK, p)
            while p.next_due <= now:
                p.next_due += self.interval
            self._at(p.next_due, p)
        elif p.check is not None and not p.judged:
            late = p.check.deadline(self.settings.read_timeout)
            self._at(now + self.settings.read_timeout if late is None else late, p)

    # ---- synchronously, for tests and benchmarks ------------------------------------------
    def read_all(self, due: float | None = None, timeout: float | None = None) -> float:
        """Read every backend and proxy now (as scheduled at `due`, monotonic) and return once each is
        judged (answer or deadline); the seconds that took. Not while run_forever runs."""
        started = self.monotonic()
        due = started if due is None else due
        with self._lock:
            slots = list(self._slots.values())
            proxies = list(self._proxies.values())
            for slot in slots:
                self._settle(slot)
                self._start_read(slot, due)
            for p in proxies:
                if p.check is None:
                    p.check = Job(self._proxy_lane(p), p.target.endpoint, answers, p.target, MODELS,
                                  notify=self._notifier(p), due=due,
                                 clock=self.monotonic)
                    p.judged = False
                    self._at(started + self.settings.read_timeout + SLACK, p)
        limit = started + (timeout if timeout is not None else 4 * self.settings.read_timeout + 5)
        while self.monotonic() < limit:
            with self._lock:
                pending = [s for s in slots if not s.judged] + [p for p in proxies if not p.judged]
            if not pending:
                break
            self._pump(max_wait=0.05)
        return self.monotonic() - started

    def close(self) -> None:
        with self._lock:                      # the scheduler is between two steps: it starts nothing more
            self._closed = True
        self._steady.shutdown()
        self._suspect.shutdown()
        self._probes.shutdown(wait=False, cancel_futures=True)

    # ---- what the service shows ------------------------------------------------------------
    def _publish(self, slot: BackendSlot) -> None:
        st = slot.state
        offset = self.clock() - self.monotonic()
        if abs(offset - self._to_wall) > 0.5:   # the wall clock was stepped: show times on the new clock
            self._to_wall = offset
        to_wall = self._to_wall
        stalled = st.last if st.verdict == Verdict.STALLED else None   # the page a stalled verdict was judged on
        slot.view = BackendView(
            name=slot.backend.name,
            url=slot.backend.url,
            verdict=st.verdict,
            reason=st.reason,
            since=st.since + to_wall,
            in_flight=st.in_flight,
            tokens_per_second=st.tokens_per_second,
            last_progress=None if st.last_progress is None else st.last_progress + to_wall,
            readings=dict(slot.readings),
            probes=dict(slot.probes),
            probes_sent=slot.probes_sent,
            steps_per_second=st.steps_per_second,
            reads_skipped=slot.reads_skipped,
            read_seconds=slot.read_seconds,
            lag_seconds=slot.lag_seconds,
            last_reading=None if slot.judged_at == float("-inf") else slot.judged_at + to_wall,
            stall_bound=st.stall_bound,
            progress_signature=progress_signature(stalled) if stalled is not None else "",
            page_is_work_queue=stalled is not None and page_is_work_queue(stalled),
        )

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = self.monotonic()
            # a probe's worker counts it when it goes out, after the view was published: the count is live
            backends = tuple(s.view if s.view.probes_sent == s.probes_sent else replace(s.view, probes_sent=s.probes_sent)
                             for s in self._slots.values() if s.view is not None)
            proxies = tuple(ProxyView(p.proxy.name, p.proxy.url, p.up) for p in self._proxies.values())
            started = self._started
            # a read still waiting for a worker is late by now - its scheduled time: lag it already has
            waiting = max((now - s.read.due for s in self._slots.values()
                           if s.read is not None and s.read.started is None and s.read.due), default=0.0)
        cycles = 0 if started is None else int((now - started) / self.interval)
        lag = max(max((b.lag_seconds for b in backends), default=0.0), waiting)
        return Snapshot(backends, proxies, cycles, lag, self.clock(), self.settings.interval)
