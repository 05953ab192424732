"""One simulated vLLM server and its clients, on a simulated clock (no sleeping).

A `World` owns a `simulator.engine.Engine` (the project's real engine model) and replays a
`bench.trace.Trace` against it: interactive arrivals, closed-loop batch workers, injected stalls.
Checkers act on it only through what a real checker has: submitting requests (`submit`), reading
the `/metrics` page (`page`), and restarting it (`restart`).

Server model:
* a stall freezes the engine (no step, gauges frozen as of the last step) until a restart;
* a restart fails every in-flight request (HTTP 500 to its client), then the server reloads for
  `reload_seconds`, refusing connections; the new process has a new start time (a new Engine);
* a request whose client gives up (timeout) is aborted, as vLLM does when the client disconnects;
* a pause (the harder day) freezes the engine like a stall, but it ends by itself: a restart during one is
  a false restart;
* a sleep (the harder day) starts once the engine is idle (vLLM sleeps with nothing in flight) and ends at
  its time; meanwhile the engine says so on its page and takes no traffic (it goes elsewhere: counted, not
  sent), and a generation request that reaches it anyway is counted (`probes_asleep`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.trace import BatchJob, Trace
from llm_health.simulator.engine import Engine, RequestState, SimRequest
from llm_health.simulator.metrics import Flavour, render

EPOCH = 1_764_460_800.0          # simulated midnight as a Unix time (process start times look real)
FLAVOUR = Flavour(engine="v1", model="sim-model")

# request kinds
INTERACTIVE = "interactive"
BATCH = "batch"
WATCHDOG = "watchdog"            # the old watchdog's chat request
PROBE = "probe"                  # llm-health's idle probe (max_tokens 1)

Done = Callable[[str, float], None]   # (outcome ok|timeout|500|refused, time)


@dataclass
class Tracked:
    req: SimRequest
    kind: str
    deadline: float | None
    on_done: Done | None


@dataclass
class RestartRecord:
    at: float
    by: str
    reason: str
    stalled: bool                # the engine was stalled: a real fix
    reloading: bool              # it was already reloading (a restart of a restart)
    failed: int                  # in-flight requests failed with 500


@dataclass
class StallRecord:
    scheduled: float
    start: float
    work: int = 0                 # requests in flight when the engine froze (0: an idle engine)
    restart_at: float | None = None
    restart_by: str = ""


@dataclass
class Worker:
    item: tuple[int, int] | None = None
    send_at: float | None = None
    inflight: Tracked | None = None


@dataclass
class JobState:
    job: BatchJob
    next_item: int = 0
    workers: list[Worker] = field(default_factory=list)
    done: int = 0
    failed: int = 0


class World:
    def __init__(self, name: str, trace: Trace, *, max_num_seqs: int = 12, step_seconds: float = 0.125,
                 chunk_tokens: int = 512, kv_blocks: int = 16_384, reload_seconds: float = 240.0,
                 sample_every: float = 60.0) -> None:
        self.name = name
        self.trace = trace
        self.engine_kwargs = {"max_num_seqs": max_num_seqs, "step_seconds": step_seconds,
                              "chunk_tokens": chunk_tokens, "kv_blocks": kv_blocks, "flavour": "v1"}
        self.reload_seconds = reload_seconds
        self.now = 0.0
        self.engine: Engine | None = Engine(start=0.0, **self.engine_kwargs)
        self.process_start = EPOCH - 86_400.0
        self.up_at: float | None = None
        self.stalled: StallRecord | None = None
        self.stall_queue = sorted(trace.stalls)
        self.stalls: list[StallRecord] = []
        self.restarts: list[RestartRecord] = []
        self.tracked: dict[int, Tracked] = {}
        self.next_arrival = 0
        self.jobs = [JobState(j, workers=[Worker(send_at=j.start) for _ in range(j.concurrency)])
                     for j in trace.batches]
        self.stats: dict[str, int] = dict.fromkeys(
            ("interactive_sent", "interactive_ok", "interactive_500", "interactive_refused",
             "batch_sent", "batch_ok", "batch_500", "batch_refused", "failed_by_restart", "refused",
             "watchdog_sent", "watchdog_busy", "probes", "probes_busy"), 0)
        # generation requests of a checker that met work in flight: (t, kind, cause, description)
        self.busy_hits: list[tuple[float, str, str, str]] = []
        self.errors_500: list[float] = []          # times of 500 answers (a log a watchdog may count)
        self.sample_every = sample_every
        self.next_sample = 0.0
        self.samples: list[tuple[float, int, int, bool, bool]] = []   # t, running, waiting, up, stalled
        self.pause_queue = sorted(trace.pauses)
        self.paused_until: float | None = None
        self.pauses_run: list[tuple[float, float]] = []           # (start, end) of the pauses that happened
        self.sleep_queue = sorted(trace.sleeps)
        self.asleep_until: float | None = None
        self.sleeps_run: list[tuple[float, float]] = []
        self.stats.update(probes_asleep=0, routed_elsewhere=0)

    # ---- what a checker may look at -------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.engine is not None

    @property
    def in_flight(self) -> int:
        """The engine's true running + waiting (not the gauges): what 'busy' means for probe counting."""
        return self.engine.in_flight if self.engine is not None else 0

    def page(self) -> str | None:
        """The /metrics page as the server would answer it now (None: connection refused)."""
        if self.engine is None:
            return None
        return render(self.engine, FLAVOUR, process_start_time=self.process_start)

    # ---- what a checker may do -------------------------------------------------------------
    def submit(self, kind: str, prompt_tokens: int, max_tokens: int, timeout: float | None = None,
               on_done: Done | None = None) -> Tracked | None:
        """Send a request now; None (and on_done('refused')) when the server refuses connections."""
        counter = {INTERACTIVE: "interactive_sent", BATCH: "batch_sent", WATCHDOG: "watchdog_sent",
                   PROBE: "probes"}[kind]
        self.stats[counter] += 1
        if kind in (INTERACTIVE, BATCH) and self.asleep_until is not None:
            self.stats["routed_elsewhere"] += 1       # the load balancer sends it to an awake server
            if on_done:
                on_done("refused", self.now)
            return None
        if kind in (WATCHDOG, PROBE) and self.asleep_until is not None:
            self.stats["probes_asleep"] += 1
        if kind in (WATCHDOG, PROBE) and self.in_flight > 0:
            self.stats["watchdog_busy" if kind == WATCHDOG else "probes_busy"] += 1
            self.busy_hits.append((self.now, kind, self.busy_cause(), self.describe()))
        if self.engine is None:
            self.stats["refused"] += 1
            if kind in (INTERACTIVE, BATCH):
                self.stats[f"{kind}_refused"] += 1
            if on_done:
                on_done("refused", self.now)
            return None
        req = self.engine.submit(prompt_tokens, max_tokens)
        t = Tracked(req, kind, None if timeout is None else self.now + timeout, on_done)
        self.tracked[req.request_id] = t
        return t

    def restart(self, by: str, reason: str) -> RestartRecord:
        failed: list[SimRequest] = []
        reloading = self.engine is None
        if self.engine is not None:
            failed = self.engine.fail_all("restart")
        rec = RestartRecord(self.now, by, reason, stalled=self.stalled is not None, reloading=reloading,
                            failed=len(failed))
        self.paused_until = None
        if self.asleep_until is not None:
            self.asleep_until = None
        self.restarts.append(rec)
        if self.stalled is not None:
            self.stalled.restart_at = self.now
            self.stalled.restart_by = by
            self.stalled = None
        self.engine = None
        self.up_at = self.now + self.reload_seconds
        self.stats["failed_by_restart"] += len(failed)
        for req in failed:
            self.errors_500.append(self.now)
            t = self.tracked.pop(req.request_id, None)
            if t is not None:
                if t.kind in (INTERACTIVE, BATCH):
                    self.stats[f"{t.kind}_500"] += 1
                if t.on_done:
                    t.on_done("500", self.now)
        return rec

    # ---- time ------------------------------------------------------------------------------
    def _run_engine(self, t: float) -> None:
        if self.engine is None:
            self.now = max(self.now, t)
            return
        if self.stalled is not None:
            self.engine.freeze_until(t)
        elif self.paused_until is not None:
            end = min(t, self.paused_until)
            self.engine.freeze_until(end)
            if end >= self.paused_until:
                self.paused_until = None
                self.engine.advance_to(t)
        elif self.asleep_until is not None:
            self.engine.freeze_until(t)           # asleep: nothing in flight, nothing steps
        else:
            self.engine.advance_to(t)
        self.now = max(self.now, t)

    def _next_event(self, limit: float) -> float:
        nxt = limit
        if self.next_arrival < len(self.trace.interactive):
            nxt = min(nxt, self.trace.interactive[self.next_arrival].at)
        if self.stall_queue:
            nxt = min(nxt, self.stall_queue[0])
        if self.up_at is not None:
            nxt = min(nxt, self.up_at)
        for at in (self.pause_queue[0][0] if self.pause_queue else None, self.paused_until,
                   self.sleep_queue[0][0] if self.sleep_queue else None, self.asleep_until):
            if at is not None and at > self.now:
                nxt = min(nxt, at)
        for js in self.jobs:
            for w in js.workers:
                if w.send_at is not None:
                    nxt = min(nxt, w.send_at)
        return max(nxt, self.now)

    def advance_to(self, t: float) -> None:
        """Run the world up to time `t`: engine steps, arrivals, batch workers, stalls, reloads."""
        while True:
            ev = self._next_event(t)
            self._run_engine(ev)
            self._settle()
            fired = self._fire(ev)
            if not fired and ev >= t:
                break
        self._sample()

    def _fire(self, now: float) -> bool:
        fired = False
        if self.up_at is not None and self.up_at <= now:
            self.engine = Engine(start=self.up_at, **self.engine_kwargs)
            self.process_start = EPOCH + self.up_at
            self.up_at = None
            fired = True
        while self.stall_queue and self.stall_queue[0] <= now:
            if self.engine is None:
                # reloading: the stall hits the next process as soon as it is up
                self.stall_queue[0] = self.up_at if self.up_at is not None else now
                break
            at = self.stall_queue.pop(0)
            if self.stalled is None:
                self.stalled = StallRecord(scheduled=at, start=now, work=self.in_flight)
                self.stalls.append(self.stalled)
            fired = True
        while self.pause_queue and self.pause_queue[0][0] <= now:
            at, seconds = self.pause_queue.pop(0)
            if self.engine is not None and self.stalled is None and self.asleep_until is None and self.in_flight:
                self.paused_until = now + seconds
                self.pauses_run.append((now, now + seconds))
            fired = True
        if self.asleep_until is not None and self.asleep_until <= now:
            if self.engine is not None:
                self.engine.sleep_level = 0
            self.asleep_until = None
            fired = True
        if self.sleep_queue and self.sleep_queue[0][0] <= now and self.engine is not None and not self.in_flight \
                and self.stalled is None and self.paused_until is None:
            at, seconds = self.sleep_queue.pop(0)
            if now < at + seconds:
                self.engine.sleep_level = 1
                self.asleep_until = at + seconds
                self.sleeps_run.append((now, at + seconds))
            fired = True
        arrivals = self.trace.interactive
        while self.next_arrival < len(arrivals) and arrivals[self.next_arrival].at <= now:
            a = arrivals[self.next_arrival]
            self.next_arrival += 1
            self.submit(INTERACTIVE, a.prompt_tokens, a.max_tokens, on_done=self._interactive_done)
            fired = True
        for js in self.jobs:
            for w in js.workers:
                if w.send_at is not None and w.send_at <= now:
                    fired = True
                    self._send_item(js, w)
        return fired

    def _send_item(self, js: JobState, w: Worker) -> None:
        w.send_at = None
        if w.item is None:
            if self.now >= js.job.end or js.next_item >= len(js.job.items):
                return            # the job is over for this worker
            w.item = js.job.items[js.next_item]
            js.next_item += 1

        def done(outcome: str, at: float) -> None:
            w.inflight = None
            if outcome == "ok":
                js.done += 1
                self.stats["batch_ok"] += 1
                w.item = None
                w.send_at = at    # the next item right away
            else:
                js.failed += 1
                w.send_at = at + js.job.retry_after
                if at + js.job.retry_after >= js.job.end:
                    w.send_at = None
                    w.item = None

        w.inflight = self.submit(BATCH, w.item[0], w.item[1], on_done=done)

    def _interactive_done(self, outcome: str, _at: float) -> None:
        if outcome == "ok":
            self.stats["interactive_ok"] += 1

    def _settle(self) -> None:
        """Finished requests answer their clients; clients past their deadline give up (abort)."""
        if not self.tracked:
            return
        for rid, t in list(self.tracked.items()):
            req = t.req
            if req.state == RequestState.FINISHED:
                del self.tracked[rid]
                if t.on_done:
                    t.on_done("ok", req.finish_time if req.finish_time is not None else self.now)
            elif t.deadline is not None and self.now >= t.deadline:
                del self.tracked[rid]
                if self.engine is not None:
                    self.engine.abort(req)
                if t.on_done:
                    t.on_done("timeout", self.now)

    def _sample(self) -> None:
        while self.next_sample <= self.now:
            e = self.engine
            running = len(e.running) if e is not None else 0
            waiting = len(e.waiting) if e is not None else 0
            self.samples.append((self.next_sample, running, waiting, e is not None, self.stalled is not None))
            self.next_sample += self.sample_every

    def busy_cause(self) -> str:
        """Why a checker's request met work in flight: the page showed it (`visible`), the engine is
        stalled with its gauges frozen (`stalled`), or the work arrived after the engine's last step
        (`race`: the gauges are as of the last step, at most `step_seconds` old)."""
        e = self.engine
        if e is None:
            return "reloading"
        if e.stats.running + e.stats.waiting > 0:
            return "visible"
        if self.stalled is not None:
            return "stalled"
        return "race"

    def describe(self) -> str:
        e = self.engine
        if e is None:
            return "reloading"
        arrivals = sorted(r.arrival for r in [*e.running, *e.waiting])
        return (f"{len(e.running)} running, {len(e.waiting)} waiting (gauges: {e.stats.running} running, "
                f"{e.stats.waiting} waiting); stalled={self.stalled is not None}; "
                f"earliest arrival {self.now - arrivals[0]:.3f} s ago" if arrivals else "")

    def paused_at(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.pauses_run)

    def stalled_at(self, t: float) -> bool:
        """Was the engine stalled at time t (for classifying restarts after the fact)?"""
        for s in self.stalls:
            end = s.restart_at if s.restart_at is not None else float("inf")
            if s.start <= t < end:
                return True
        return False


def count_since(times: list[float], since: float) -> int:
    return len(times) - bisect.bisect_right(times, since)
