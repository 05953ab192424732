"""The two checkers of the incident replay, each acting on its own `World`.

* `OldWatchdog`: the incident's pair of watchdogs. (1) a real chat request every 5 min with a 45 s
  timeout, queued like any request; 5 failures in a row -> restart. (2) a 500-counter: every minute,
  >= 10 HTTP 500s since max(10 min ago, its own last restart) -> restart.
* `LlmHealth`: the project's real code on simulated readings: `simulator.metrics.render` ->
  `exporter.reading.read_text` -> `exporter.verdict.judge` every exporter interval; the idle probe
  follows exporter.scheduler's rule (fresh reading with no work, one in flight, one per interval);
  the remediator is `remediator.policy.decide` (gates, then the real `exporter.check.verify` over
  loopback against the simulated server, then the decision, then the drain of a stalled backend
  (`stalled_drain_timeout`: its requests finish nothing). Modelled, not run: Prometheus and Alertmanager
  (bench/pipeline.py `Timing`: the exporter scraped and the restart alerts' group evaluated as shipped, the
  alerts' `for`, the restart route's `group_wait`, repeat_interval; each clock at a phase the seed draws) and the
  authority's incident bookkeeping (one incident per backend; warm-up ends when the server answers again).
  Every stall's path is timed (bench/pipeline.py `Path`): frozen -> first stalled verdict -> alert firing ->
  notification delivered -> verification done -> drain done -> restart started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.pipeline import Path, Timing, shipped
from bench.world import PROBE, WATCHDOG, StallRecord, World, count_since
from llm_health.exporter.check import verify
from llm_health.exporter.observation import (
    FrozenEvidence,
    Observation,
    ProbeOutcome,
    ProbeResult,
    ReadResult,
    VerifyOutcome,
)
from llm_health.exporter.reading import read_text
from llm_health.exporter.verdict import (
    BackendState,
    Thresholds,
    Verdict,
    idle_believable,
    judge,
    may_probe_engine,
    progress_signature,
)
from llm_health.remediator import policy
from llm_health.remediator.restart import choices

BACKEND = "gpu-a"


@dataclass
class OldWatchdog:
    chat_every: float = 300.0
    chat_timeout: float = 45.0
    chat_prompt: int = 40
    chat_max_tokens: int = 128        # a short real answer: ~16 s at 8 tokens/s once it has a slot
    failures_to_restart: int = 5
    errors_every: float = 60.0
    errors_window: float = 600.0
    errors_to_restart: int = 10
    name: str = "old watchdog"
    next_chat: float = 300.0
    next_count: float = 60.0
    consecutive: int = 0
    results: list[str] = field(default_factory=list)
    last_500_restart: float = float("-inf")
    detected: dict[int, float] = field(default_factory=dict)   # id(stall) -> when it was "detected" (restart)

    def tick(self, world: World, now: float) -> None:
        while self.results:
            outcome = self.results.pop(0)
            self.consecutive = 0 if outcome == "ok" else self.consecutive + 1
            if self.consecutive >= self.failures_to_restart:
                self._restart(world, "chat watchdog", f"{self.consecutive} chat requests failed in a row")
                self.consecutive = 0
        if now >= self.next_chat:
            self.next_chat += self.chat_every
            world.submit(WATCHDOG, self.chat_prompt, self.chat_max_tokens, timeout=self.chat_timeout,
                         on_done=lambda outcome, _t: self.results.append(outcome))
        if now >= self.next_count:
            self.next_count += self.errors_every
            since = max(now - self.errors_window, self.last_500_restart)
            n = count_since(world.errors_500, since)
            if n >= self.errors_to_restart:
                self.last_500_restart = now
                self._restart(world, "500 watchdog", f"{n} HTTP 500s in the last {self.errors_window:g} s")

    def _restart(self, world: World, by: str, reason: str) -> None:
        stall = world.stalled
        world.restart(by, reason)
        if stall is not None:
            self.detected.setdefault(id(stall), world.now)


@dataclass
class AlertState:
    name: str
    hold: float                          # the rule's `for`
    pending_since: float | None = None
    firing: bool = False
    last_sent: float | None = None


@dataclass
class Incident:
    opened: float
    state: str = "open"                  # open | warming
    next_check: float = 0.0


class LlmHealth:
    name = "llm-health"

    def __init__(self, mirror_url: str, timing: Timing | None = None) -> None:
        self.timing = timing or shipped()
        self.s = self.timing.exporter
        self.r = self.timing.remediator
        self.thresholds = Thresholds.from_settings(self.s)
        self.policy = policy.Settings(backoff=self.r.backoff, budget=self.r.budget, breaker=self.r.breaker,
                                      unknown_retry=max(self.r.verify_interval, self.r.poll_interval))
        self.url = mirror_url
        self.state: BackendState | None = None
        self.next_cycle = self.timing.exporter_phase
        self.next_scrape = self.timing.scrape_phase
        self.next_evaluation = self.timing.evaluation_phase
        self.scraped: Verdict = Verdict.UNKNOWN          # the verdict as Prometheus last scraped it
        self.probe_result: ProbeResult | None = None
        self.probe_pending = False
        self.probe_sent_at = 0.0
        self.last_probe_cycle: float | None = None
        self.alerts = {
            Verdict.STALLED: AlertState("LLMBackendStalled", self.timing.stall_for),
            Verdict.DOWN: AlertState("LLMBackendDown", self.timing.down_for),
        }
        self.outbox: list[tuple[float, str, str]] = []   # (deliver at, alertname, firing|resolved)
        self.incident: Incident | None = None
        self.restarts: list[float] = []
        self.decisions: list[tuple[float, str, str]] = []
        self.verdicts: list[tuple[float, str, str]] = []  # verdict changes: (t, verdict, reason)
        self.detected: dict[int, float] = {}              # id(stall) -> first stalled/down verdict
        self.paths: dict[int, Path] = {}                  # id(stall) -> when it passed each step
        self.alarms_without_stall: list[tuple[float, str, str]] = []
        self.cycles = 0

    # ---- the exporter ----------------------------------------------------------------------
    def mark(self, world: World, step: str, t: float) -> None:
        stall = world.stalled
        if stall is not None:
            path = self.paths.setdefault(id(stall), Path(work=stall.work > 0))
            path.mark("frozen", stall.start)
            path.mark(step, t)

    def tick(self, world: World, now: float) -> None:
        if now >= self.next_cycle:
            while self.next_cycle <= now:
                self.next_cycle += self.s.interval
            self.cycle(world, now)
        if now >= self.next_scrape:
            while self.next_scrape <= now:
                self.next_scrape += self.timing.scrape_interval
            self.scraped = self.state.verdict if self.state is not None else Verdict.UNKNOWN
        if now >= self.next_evaluation:
            while self.next_evaluation <= now:
                self.next_evaluation += self.timing.evaluation_interval
            self._evaluate_alerts(world, now)
        self.outbox.sort(key=lambda item: item[0])
        while self.outbox and self.outbox[0][0] <= world.now:
            _, alertname, status = self.outbox.pop(0)
            self.notify(world, alertname, status)
        if self.incident is not None and self.incident.next_check <= world.now:
            self.handle_incident(world)

    def cycle(self, world: World, now: float) -> None:
        self.cycles += 1
        page = world.page()
        if page is None:
            obs = Observation(outcome=ReadResult.REFUSED, detail="connection refused")
        else:
            obs = Observation(outcome=ReadResult.OK, reading=read_text(page))
        if self.probe_result is not None:
            obs = Observation(outcome=obs.outcome, reading=obs.reading, detail=obs.detail, probe=self.probe_result)
            self.probe_result = None
        prev = self.state.verdict if self.state is not None else None
        self.state = judge(self.state, obs, now, self.thresholds)
        v = self.state.verdict
        if v != prev:
            self.verdicts.append((now, v.value, self.state.reason))
        if v in (Verdict.STALLED, Verdict.DOWN):
            stall = world.stalled
            if stall is not None:
                self.detected.setdefault(id(stall), now)
                self.mark(world, "verdict", now)
            elif world.up and (not self.alarms_without_stall or self.alarms_without_stall[-1][0] < now - 60):
                self.alarms_without_stall.append((now, v.value, self.state.reason))
        if self._may_probe(obs, now):
            self.last_probe_cycle = now
            self.probe_pending = True
            self.probe_sent_at = now
            world.submit(PROBE, 2, 1, timeout=self.s.probe_timeout, on_done=self._probe_done)

    def _may_probe(self, obs: Observation, now: float) -> bool:
        """exporter.scheduler.ReadScheduler._may_probe's rule, on the simulated clock."""
        reading = obs.reading
        if obs.outcome != ReadResult.OK or reading is None or not reading.has_engine_metrics or reading.work > 0:
            return False
        if not may_probe_engine(reading) or (self.state is not None and self.state.probe_unanswered):
            return False
        if self.probe_pending or self.state is None or not idle_believable(self.state, obs):
            return False
        gap = max(self.s.interval, self.s.probe_every)
        return self.last_probe_cycle is None or now - self.last_probe_cycle >= gap - 1e-6

    def _probe_done(self, outcome: str, at: float) -> None:
        self.probe_pending = False
        result = {"ok": ProbeOutcome.OK, "timeout": ProbeOutcome.TIMEOUT}.get(outcome, ProbeOutcome.ERROR)
        self.probe_result = ProbeResult(result, "" if result == ProbeOutcome.OK else outcome, at - self.probe_sent_at)

    # ---- Prometheus + Alertmanager (modelled) -------------------------------------------------
    def _evaluate_alerts(self, world: World, now: float) -> None:
        """One rule evaluation on the last scraped verdict: pending, then firing once active for `for`
        (Prometheus: at the first evaluation at least `for` after the first active one)."""
        t = self.timing
        for when, alert in self.alerts.items():
            if self.scraped == when:
                if alert.pending_since is None:
                    alert.pending_since = now
                if not alert.firing and now - alert.pending_since >= alert.hold:
                    alert.firing = True
                    alert.last_sent = now
                    self.outbox.append((now + t.group_wait, alert.name, "firing"))
                    self.mark(world, "firing", now)
                elif alert.firing and alert.last_sent is not None and now - alert.last_sent >= t.repeat_interval:
                    alert.last_sent = now
                    self.outbox.append((now, alert.name, "firing"))
            else:
                alert.pending_since = None
                if alert.firing:
                    alert.firing = False
                    self.outbox.append((now + t.group_interval, alert.name, "resolved"))

    # ---- the remediator ------------------------------------------------------------------------
    def notify(self, world: World, alertname: str, status: str) -> None:
        now = world.now
        if status == "firing":
            self.mark(world, "delivered", now)
            if world.stalled is not None and not self.paths[id(world.stalled)].alert:
                self.paths[id(world.stalled)].alert = alertname
            if self.incident is None:
                self.incident = Incident(opened=now, next_check=now + self.r.poll_interval)
                self.decisions.append((now, "incident_opened", f"{alertname} firing"))
            return
        if self.incident is not None and self.incident.state == "open" and not any(
                a.firing for a in self.alerts.values()):
            self.decisions.append((now, "resolved", f"{alertname} resolved; incident closed"))
            self.incident = None

    def _facts(self, now: float) -> policy.Facts:
        times = tuple(self.restarts)
        return policy.Facts(now=now, backend=BACKEND, restarts=times, fleet_restarts=times, has_action=True)

    def handle_incident(self, world: World) -> None:
        inc = self.incident
        assert inc is not None
        now = world.now
        if inc.state == "warming":
            if world.up:
                self.decisions.append((now, "recovered", "the server answers again; incident closed"))
                self.incident = None
            else:
                inc.next_check = now + self.r.warmup_poll
            return
        d = policy.decide(self._facts(now), None, self.policy)
        if d.kind == policy.VERIFY:
            v = verify(self.url, readings=max(2, self.r.verify_readings), interval=self.r.verify_interval,
                       read_timeout=self.s.read_timeout, probe_timeout=self.s.probe_timeout,
                       sleep=lambda s: world.advance_to(world.now + s), clock=lambda: world.now,
                       model="sim-model", evidence=self._evidence(now))
            now = world.now
            self.mark(world, "verified", now)
            d = policy.decide(self._facts(now), v, self.policy)
            if d.kind == policy.RESTART:
                self._drain(world, v.outcome)
                now = world.now
        self.decisions.append((now, d.kind, d.reason))
        if d.kind == policy.RESTART:
            stall = world.stalled
            self.mark(world, "restarted", now)
            world.restart(self.name, d.reason)
            if stall is not None:
                self.detected.setdefault(id(stall), now)
            self.restarts.append(now)
            inc.state = "warming"
            inc.next_check = now + self.r.warmup_poll
        elif d.kind in (policy.VERIFIED_HEALTHY, policy.RESTARTED_BY_OTHER):
            self.incident = None
        else:
            inc.next_check = d.retry_at if d.retry_at is not None else now + self.r.poll_interval


    def _evidence(self, now: float) -> FrozenEvidence | None:
        """What the exporter's /verdicts would answer the verification (remediator/backend_io.py)."""
        st = self.state
        if (not self.timing.evidence or st is None or st.verdict != Verdict.STALLED or st.last is None
                or st.last_progress is None):
            return None
        return FrozenEvidence(progress_signature(st.last), now - st.last_progress, now, st.stall_bound)

    def _drain(self, world: World, outcome: VerifyOutcome) -> None:
        """remediator/restart/choices.py: a verified-down backend is not drained; a stalled one is drained for
        `stalled_drain_timeout` (its requests finish nothing); anything else until its work is done (or
        `drain_timeout`)."""
        if outcome == VerifyOutcome.DOWN:
            self.mark(world, "drained", world.now)
            return
        limit, _ = choices.drain_timeout(outcome, self.r)
        deadline = world.now + limit
        while world.now < deadline and world.in_flight > 0:
            world.advance_to(min(deadline, world.now + 1.0))
        self.mark(world, "drained", world.now)


def detection_delays(world: World, detected: dict[int, float]) -> list[tuple[StallRecord, float | None]]:
    return [(s, (detected[id(s)] - s.start) if id(s) in detected else None) for s in world.stalls]
