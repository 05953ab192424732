"""The one restart authority: a thread that holds a lease row in SQLite and carries incidents through.

Every gunicorn worker runs an `Authority`; only the lease holder acts. On top of the lease, every
claim (OPEN -> RESTARTING) is an atomic state transition inside BEGIN IMMEDIATE that also records the
intent (an `actions` row, which is what the budget and backoff count) BEFORE the argv runs, so two
authorities, or one that crashed mid-restart, can never repeat a restart.

The restart procedure is a sequence of explicit steps, each a method, and each backend's lifecycle
(remediator/lifecycle.py, persisted by remediator/fleet.py) follows it:

    consider (gates, host mutex) -> verify -> min_ready floor -> silence
      -> drain (READY -> DRAINING; the agent answers `drain`; wait for in-flight work or the timeout)
      -> claim (intent; DRAINING -> STOPPED) -> act (STOPPED -> INITIALIZING)
      -> warm up (INITIALIZING -> READY, recovered | -> ERROR, escalated, needs_ack) -> expire the silence

A backend that is already down skips the drain (READY -> STOPPED). Progress seen during the drain calls
the restart off (DRAINING -> READY): the engine is evidently not stalled (principle 1).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from llm_health.remediator import action as act
from llm_health.remediator import fleet, inflight, lifecycle, policy
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.marker import file_markers
from llm_health.remediator.silence import SilenceError, create_silence, expire_silence
from llm_health.remediator.store import (
    CLOSED,
    DRAINING,
    NEEDS_ACK,
    OBSERVED,
    OPEN,
    RESTART_STATES,
    RESTARTING,
    WARMING,
    Store,
)

from llm_health.config import Backend, Config

log = logging.getLogger("llm_health.remediator")

LEASE = "authority"
S = LifecycleState
DEFERRED_HOST = "deferred_host"
DEFERRED_MIN_READY = "deferred_min_ready"
SILENCE_MARGIN = 60.0          # seconds a restart's silence outlasts drain + action + warm-up
SILENCE_TIMEOUT = 3.0          # HTTP timeout towards Alertmanager (never blocks a restart for long)
ERROR_LOOK_MIN = 30.0          # an ERROR backend gets a full warm-up check at most this often ...
ERROR_LOOK_POLLS = 6           # ... or every warmup_poll * this, whichever is longer
LOOK_BUDGET = 10.0             # wall-clock seconds per tick for ERROR backends' checks (the rest: next tick)
VERIFY = "verify"              # probe purposes (llm_health_remediator_probes_total{purpose})
WARMUP = "warmup"

#: while set (per thread), every idle probe exporter.check sends is appended here (counted afterwards)
_probe_log: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("probe_log", default=None)


def install_probe_counter() -> None:
    """Count every generation request exporter.check.verify sends on our behalf (principle 2): its
    `Prober` is wrapped so that each `probe()` is noted in the calling thread's `_probe_log` (a no-op
    for anyone else, e.g. the exporter). The authority turns the notes into SQLite counters."""
    try:
        from llm_health.exporter import check
    except ImportError:
        return
    base = getattr(check, "Prober", None)
    if base is None or getattr(base, "counted_by_remediator", False):
        return

    class CountingProber(base):  # type: ignore[misc, valid-type]
        counted_by_remediator = True

        def probe(self, *args: Any, **kwargs: Any) -> Any:
            sink = _probe_log.get()
            if sink is not None:
                sink.append("probe")       # counted before it goes out: a probe that fails was sent too
            return super().probe(*args, **kwargs)

    check.Prober = CountingProber


@dataclass(frozen=True)
class SimpleVerification:
    outcome: str
    reason: str
    in_flight: int | None = None


Verifier = Callable[[Backend], Any]                  # -> object with .outcome and .reason
WarmupCheck = Callable[[Backend], tuple[bool, str]]  # -> (ready, why)
InFlightReader = Callable[[Backend], InFlight]
Runner = Callable[[Sequence[str], float, dict[str, str]], act.ActionResult]


def read_api_key(config: Config) -> tuple[str, str]:
    """(key, problem): the exporter's API key (`exporter.api_key_file`), read once; "" when not set."""
    path = str(getattr(config.exporter, "api_key_file", "") or "")
    if not path:
        return "", ""
    try:
        return config.resolve_path(path).read_text().strip(), ""
    except (OSError, UnicodeDecodeError) as exc:
        return "", f"exporter.api_key_file {path} unreadable: {exc.__class__.__name__}"


def default_verifier(config: Config) -> Verifier:
    """exporter.check.verify with the configured readings; any error is `unknown` (fail closed)."""
    r = config.remediator
    install_probe_counter()
    api_key, key_problem = read_api_key(config)

    def verify_backend(backend: Backend) -> Any:
        try:
            from llm_health.exporter.check import verify
        except ImportError as exc:
            return SimpleVerification("unknown", f"verifier unavailable: {exc}")
        if key_problem:
            return SimpleVerification("unknown", key_problem)
        extra: dict[str, Any] = {}
        if api_key and "api_key" in inspect.signature(verify).parameters:
            extra["api_key"] = api_key
        try:
            return verify(
                backend.url, readings=max(2, r.verify_readings), interval=r.verify_interval,
                read_timeout=config.exporter.read_timeout, probe_timeout=config.exporter.probe_timeout,
                sleep=time.sleep, clock=time.time, model=backend.model, **extra,
            )
        except Exception as exc:  # noqa: BLE001 - a broken verifier must never mean "restart"
            return SimpleVerification("unknown", f"verification raised {exc!r}")

    return verify_backend


def default_answer_check(config: Config) -> WarmupCheck:
    """/health 200 and /v1/models 200 listing the configured model; no generation request. Used for a
    backend seen for the first time (start-up: INITIALIZING -> READY)."""
    timeout = config.exporter.read_timeout

    def check(backend: Backend) -> tuple[bool, str]:
        try:
            health = requests.get(f"{backend.url}/health", timeout=timeout)
            if health.status_code != 200:
                return False, f"/health answered {health.status_code}"
            models = requests.get(f"{backend.url}/v1/models", timeout=timeout)
            if models.status_code != 200:
                return False, f"/v1/models answered {models.status_code}"
            if backend.model:
                ids = [m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)]
                if backend.model not in ids:
                    return False, f"/v1/models does not list {backend.model!r} yet"
        except (requests.RequestException, ValueError, AttributeError) as exc:
            return False, f"not answering: {exc.__class__.__name__}"
        return True, "answers /health and /v1/models"

    return check


def default_warmup_check(config: Config, verifier: Verifier) -> WarmupCheck:
    """Warm = /health 200, /v1/models 200 (listing the configured model), and a healthy verification:
    engine progress, or (idle) a one-token request that succeeds (exporter.check.verify)."""
    answers = default_answer_check(config)

    def check(backend: Backend) -> tuple[bool, str]:
        ok, why = answers(backend)
        if not ok:
            return False, why
        v = verifier(backend)
        outcome = str(getattr(v, "outcome", "unknown"))
        if outcome in policy.HEALTHY_OUTCOMES:
            return True, f"answers again: /health, /v1/models, verify {outcome}"
        return False, f"verify {outcome}: {getattr(v, 'reason', '')}"

    return check


def default_in_flight(config: Config) -> InFlightReader:
    r = config.remediator

    def read(backend: Backend) -> InFlight:
        sock = str(config.resolve_path(r.haproxy_socket)) if r.haproxy_socket else ""
        return inflight.read_in_flight(backend, config.exporter.read_timeout, sock, r.haproxy_proxy)

    return read


def _runner(argv: Sequence[str], timeout: float, env: dict[str, str]) -> act.ActionResult:
    return act.run_action(argv, timeout, env)


class Authority:
    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        verifier: Verifier | None = None,
        warmup_check: WarmupCheck | None = None,
        clock: Callable[[], float] = time.time,
        runner: Runner = _runner,
        holder: str | None = None,
        answer_check: WarmupCheck | None = None,
        in_flight: InFlightReader | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.r = config.remediator
        self.verifier = verifier or default_verifier(config)
        self.warmup_check = warmup_check or default_warmup_check(config, self.verifier)
        self.answer_check = answer_check or default_answer_check(config)
        self.in_flight = in_flight or default_in_flight(config)
        self._next_look: dict[str, float] = {}   # backend -> when to check its lifecycle again
        self.clock = clock
        self.runner = runner
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.settings = policy.Settings(
            backoff=self.r.backoff, budget=self.r.budget, breaker=self.r.breaker,
            unknown_retry=max(self.r.verify_interval, self.r.poll_interval),
            unresponsive_after=self.r.unresponsive_after,
        )
        self.lease_ttl = max(5.0, 10 * self.r.poll_interval)
        self.busy_dir = config.resolve_path(self.r.busy_dir) if self.r.busy_dir else None
        self._stop = threading.Event()
        self._holding = threading.Event()
        self._recovered = False
        self._threads: list[threading.Thread] = []
        self.last_pass = time.monotonic()

    # -- thread lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._lease_loop, "lease"), (self._work_loop, "authority")):
            t = threading.Thread(target=target, name=f"remediator-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _lease_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.renew_lease()
            except Exception:  # noqa: BLE001 - keep the authority alive; log and retry
                log.exception("lease renewal failed")
                self._holding.clear()
            self._stop.wait(self.lease_ttl / 4)

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001
                log.exception("authority tick failed")
            self.last_pass = time.monotonic()    # read by /healthz (remediator/health.py)
            self._stop.wait(self.r.poll_interval)

    # -- the lease ----------------------------------------------------------------------------------
    def renew_lease(self) -> bool:
        now = self.clock()
        with self.store.tx() as c:
            row = c.execute("SELECT holder, expires_at FROM lease WHERE name = ?", (LEASE,)).fetchone()
            if row is None or row["holder"] == self.holder or float(row["expires_at"]) < now:
                c.execute("INSERT INTO lease (name, holder, expires_at) VALUES (?,?,?) ON CONFLICT(name) "
                          "DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                          (LEASE, self.holder, now + self.lease_ttl))
                if row is None or row["holder"] != self.holder:
                    self._recovered = False  # newly ours: look for restarts a previous holder left unfinished
                    Store.event(c, now, "lease_acquired", reason=f"{self.holder} is the restart authority",
                                previous=row["holder"] if row else None)
                self._holding.set()
                return True
        self._holding.clear()
        return False

    def _still_holder(self, c: Any, now: float) -> bool:
        row = c.execute("SELECT holder, expires_at FROM lease WHERE name = ?", (LEASE,)).fetchone()
        return row is not None and row["holder"] == self.holder and float(row["expires_at"]) >= now

    # -- one pass over the active incidents ---------------------------------------------------------
    def tick(self) -> None:
        if not self._holding.is_set():
            return
        if not self._recovered:
            self.recover()
            self._recovered = True
        self.look_after_lifecycles((S.INITIALIZING,))   # cheap: /health and /v1/models, never a probe
        self.handle_incidents()
        self.look_after_lifecycles((S.ERROR,))          # full warm-up checks: after the incidents, rationed

    def handle_incidents(self) -> None:
        for inc in self.store.active_incidents():
            if self._stop.is_set() or not self._holding.is_set():
                return
            if float(inc["next_check_at"]) > self.clock():
                continue
            backend = self.config.backend(inc["backend"])
            if backend is None:
                self._close(int(inc["id"]), inc["backend"], "closed", "backend no longer configured")
                continue
            state = inc["state"]
            if state == OPEN:
                self.consider(int(inc["id"]), backend)
            elif state == DRAINING:
                self.watch_drain(int(inc["id"]), backend)
            elif state == WARMING:
                self.watch_warmup(int(inc["id"]), backend, float(inc["warm_deadline"] or 0))
            elif state == NEEDS_ACK:
                self.watch_recovery(int(inc["id"]), backend)

    def recover(self) -> None:
        """After taking the lease: actions another (dead) holder started and never finished may have
        restarted the backend. Count them (they are already in the budget) and never repeat them.
        Their backends' lifecycle goes to ERROR (outcome unknown); a drain in progress simply resumes."""
        now = self.clock()
        interrupted: set[str] = set()
        with self.store.tx() as c:
            # our own unfinished rows too: recover() runs between ticks, when no action of ours is running,
            # so one of ours still open is a restart whose bookkeeping failed (see carry_out)
            rows = c.execute("SELECT * FROM actions WHERE result IS NULL").fetchall()
            for a in rows:
                c.execute("UPDATE actions SET result = 'interrupted', finished_at = ? WHERE id = ?", (now, a["id"]))
                inc = c.execute("SELECT * FROM incidents WHERE id = ?", (a["incident_id"],)).fetchone()
                if inc is not None and inc["state"] == RESTARTING:
                    Store.set_state(c, int(inc["id"]), now, NEEDS_ACK, last_decision="interrupted")
                Store.event(c, now, "interrupted", a["backend"], a["incident_id"],
                            reason="the remediator stopped while this restart was running: it may have "
                            "happened; not repeated (acknowledge via POST /api/backends/<name>/ack, or "
                            "the incident closes when the backend answers again or the alert resolves)",
                            action_id=a["id"], holder=a["holder"], own=a["holder"] == self.holder)
                if fleet.state_of(c, a["backend"]) != S.ERROR:
                    fleet.move(c, a["backend"], S.ERROR, now, "interrupted mid-restart: outcome unknown",
                               a["incident_id"])
                self._escalate(c, a["backend"], a["incident_id"], now, "restart interrupted: outcome unknown")
                interrupted.add(a["backend"])
        for backend in sorted(interrupted):
            self.unsilence_safely(backend)      # ERROR: its alerts must reach people again

    # -- lifecycle outside a restart ----------------------------------------------------------------
    def look_after_lifecycles(self, states: tuple[LifecycleState, ...] = (S.INITIALIZING, S.ERROR)) -> None:
        """Backends no restart of ours is carrying: a backend seen for the first time becomes READY once
        it answers /health and /v1/models (or ERROR after warmup_timeout); an ERROR backend whose
        incident was acknowledged becomes READY again once it is warm (full warm-up check, which may
        send a probe: at most every max(ERROR_LOOK_MIN, warmup_poll * ERROR_LOOK_POLLS) seconds per
        backend, and only LOOK_BUDGET seconds of them per tick; the others wait for the next tick)."""
        now = self.clock()
        todo: list[tuple[Backend, LifecycleState, float]] = []
        c = self.store.conn()
        rows = fleet.all_rows(c)
        missing = [b.name for b in self.config.backends if b.name not in rows]
        if missing:
            with self.store.tx() as tx:
                for name in missing:
                    fleet.ensure(tx, name, now)
            rows = fleet.all_rows(c)
        active = {i["backend"]: i for i in self.store.active_incidents()}
        for b in self.config.backends:
            r = rows[b.name]
            st = LifecycleState(r["state"])
            inc = active.get(b.name)
            if fleet.owned(r) or (inc is not None and inc["state"] in RESTART_STATES):
                continue
            if st not in states:
                continue
            if st == S.INITIALIZING or (st == S.ERROR and inc is None):
                if self._next_look.get(b.name, 0.0) <= now:
                    todo.append((b, st, float(r["since"])))
        todo.sort(key=lambda item: self._next_look.get(item[0].name, 0.0))   # the longest waiting first
        started = time.monotonic()
        for b, st, since in todo:
            if self._stop.is_set():
                return
            if st == S.ERROR:
                if time.monotonic() - started > LOOK_BUDGET:
                    return                                 # the rest next tick (oldest first)
                ready, why = self.probing(b, WARMUP, self.warmup_check)
            else:
                ready, why = self.answer_check(b)
            now = self.clock()
            pause = self.r.warmup_poll if st == S.INITIALIZING else max(ERROR_LOOK_MIN,
                                                                         self.r.warmup_poll * ERROR_LOOK_POLLS)
            self._next_look[b.name] = now + pause
            with self.store.tx() as c:
                r = fleet.row(c, b.name)
                if r is None or r["state"] != st.value or fleet.owned(r):
                    continue
                if ready:
                    if st == S.ERROR:
                        fleet.move(c, b.name, S.INITIALIZING, now, f"out of ERROR: {why}")
                    fleet.move(c, b.name, S.READY, now, why)
                elif st == S.INITIALIZING and lifecycle.warmup_expired(since, now, self.r.warmup_timeout):
                    fleet.move(c, b.name, S.ERROR, now, f"not answering {self.r.warmup_timeout:g}s after it "
                               f"was first seen: {why}")
                    self._escalate(c, b.name, None, now, f"{b.name} never became ready: {why}")

    def _escalate(self, c: Any, backend: str, incident_id: int | None, now: float, reason: str) -> None:
        Store.bump(c, "escalations", backend)
        Store.event(c, now, "escalated", backend, incident_id, reason=reason + "; needs a person (see the "
                    "status page; acknowledge via POST /api/backends/<name>/ack)")

    # -- step 1: gates, verification, claim ---------------------------------------------------------
    def facts(self, c: Any, backend: Backend, now: float, unresponsive_since: float | None = None) -> policy.Facts:
        br = Store.breaker(c)
        dry = self.r.dry_run
        markers = Store.api_markers(c, backend.name)
        if self.busy_dir is not None:
            markers += file_markers(self.busy_dir, backend.name, self.r.busy_file_ttl, self.r.marker_max_ttl)
        return policy.Facts(
            now=now, backend=backend.name,
            restarts=Store.restart_times(c, backend.name, include_dry_run=dry),
            fleet_restarts=Store.restart_times(c, None, since=float(br["reset_at"]), include_dry_run=dry),
            breaker_open=bool(br["open"]), markers=markers, has_action=bool(backend.restart), dry_run=dry,
            unresponsive_since=unresponsive_since,
        )

    # -- probes and verifications ------------------------------------------------------------------
    def probing(self, backend: Backend, purpose: str, check: Callable[[Backend], Any]) -> Any:
        """Run a verifier / warm-up check and count the probes it sent (`probes` counters in SQLite)."""
        sink: list[str] = []
        token = _probe_log.set(sink)
        try:
            return check(backend)
        finally:
            _probe_log.reset(token)
            if sink:
                try:
                    with self.store.tx() as c:
                        Store.bump(c, "probes", f"{backend.name}\t{purpose}", len(sink))
                except Exception:  # noqa: BLE001 - counting must never stop the restart procedure
                    log.exception("could not count %d probe(s) to %s", len(sink), backend.name)

    @staticmethod
    def record_verification(c: Any, incident_id: int, verification: Any, now: float) -> float | None:
        """Keep the latest verification on the incident (the agent answers from it) and the start of an
        unbroken run of `unresponsive` (policy: unresponsive_after). Returns that start, or None."""
        outcome = str(getattr(verification, "outcome", "unknown"))
        inc = c.execute("SELECT unresponsive_since FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        since: float | None = None
        if outcome == policy.UNRESPONSIVE:
            prior = inc["unresponsive_since"] if inc is not None else None
            since = float(prior) if prior is not None else now
        c.execute("UPDATE incidents SET verified_outcome = ?, verified_at = ?, unresponsive_since = ? WHERE id = ?",
                  (outcome[:40], now, since, incident_id))
        return since

    def consider(self, incident_id: int, backend: Backend) -> None:
        now = self.clock()
        d = policy.decide(self.facts(self.store.conn(), backend, now), None, self.settings)
        if d.kind == policy.VERIFY:
            d = self._host_gate(self.store.conn(), backend) or d
        if d.kind != policy.VERIFY:
            with self.store.tx() as c:
                if Store.incident_in(c, incident_id, OPEN) is not None:
                    self._note(c, incident_id, backend.name, d, now)
            return
        verification = self.probing(backend, VERIFY, self.verifier)
        baseline = None
        if str(getattr(verification, "outcome", "")) in ("no_progress", policy.UNRESPONSIVE):
            baseline = self.in_flight_now(backend)   # read outside the transaction: what the drain starts from
        now = self.clock()
        claimed: int | None = None
        silence = False
        with self.store.tx() as c:
            inc = Store.incident_in(c, incident_id, OPEN)
            if inc is None:
                return  # resolved or acknowledged while we verified
            since = self.record_verification(c, incident_id, verification, now)
            d = policy.decide(self.facts(c, backend, now, since), verification, self.settings)
            if d.kind == policy.RESTART:
                d = self._host_gate(c, backend) or self._floor_gate(c, backend, verification, now) or d
            if d.kind == policy.RESTART:
                if not self._still_holder(c, now):
                    return
                claimed = self.begin(c, incident_id, backend, d, verification, baseline, now)
                silence = claimed is not None or fleet.state_of(c, backend.name) == S.DRAINING
            else:
                self._note(c, incident_id, backend.name, d, now)
        if claimed is not None:
            self.carry_out(incident_id, claimed, backend, silence=silence)
        elif silence:
            self.silence_safely(incident_id, backend)

    # -- the lifecycle gates: per-host mutex and the fleet floor -------------------------------------
    def _host_gate(self, c: Any, backend: Backend) -> policy.Decision | None:
        ok, why = lifecycle.may_start(backend.name, backend.host, fleet.gate_states(c, self.config),
                                      fleet.hosts(self.config))
        return None if ok else policy.Decision(DEFERRED_HOST, f"per-host mutex: {why}; waiting until it is "
                                               "READY or ERROR")

    def _floor_gate(self, c: Any, backend: Backend, verification: Any, now: float) -> policy.Decision | None:
        ok, why = lifecycle.may_drain(backend.name, fleet.gate_states(c, self.config), self.r.min_ready,
                                      self._serves_nothing(c, backend, verification))
        if ok:
            return None
        return policy.Decision(DEFERRED_MIN_READY, f"fleet floor: {why}; a stalled backend still counts as up, "
                               "so it waits", retry_at=now + self.settings.unknown_retry)

    @staticmethod
    def _serves_nothing(c: Any, backend: Backend, verification: Any) -> bool:
        """Down (verified), or not READY in our lifecycle: taking it out lowers no capacity."""
        if str(getattr(verification, "outcome", "")) == "down":
            return True
        return fleet.state_of(c, backend.name) != S.READY

    # -- step 2: drain --------------------------------------------------------------------------------
    def begin(self, c: Any, incident_id: int, backend: Backend, d: policy.Decision, verification: Any,
              baseline: InFlight | None, now: float) -> int | None:
        """Start the restart: drain a serving backend (returns None), or claim at once (returns the action
        id) when there is nothing to drain."""
        state = fleet.state_of(c, backend.name)
        outcome = str(getattr(verification, "outcome", ""))
        if state == S.READY and outcome != "down":
            stalled = outcome in ("no_progress", policy.UNRESPONSIVE)
            timeout = self.r.stalled_drain_timeout if stalled else self.r.drain_timeout
            baseline = baseline or InFlight(None, None, None, "not read")
            if not fleet.move(c, backend.name, S.DRAINING, now,
                              f"restart decided ({d.reason}); no new requests, waiting up to {timeout:g}s for "
                              f"in-flight work ({baseline.describe()})", incident_id,
                              drain_deadline=now + timeout, drain_baseline=inflight.dump(baseline.reading)):
                return None
            Store.set_state(c, incident_id, now, DRAINING, last_decision=policy.RESTART, last_note="",
                            next_check_at=0.0)
            Store.event(c, now, "draining", backend.name, incident_id,
                        reason=f"{d.reason}; draining for up to {timeout:g}s "
                        f"({'stalled: it finishes nothing' if stalled else 'drain_timeout'})")
            return None
        if state == S.READY:
            if not fleet.move(c, backend.name, S.STOPPED, now, f"already down, nothing to drain: {d.reason}",
                              incident_id):
                return None
        return self.claim(c, incident_id, backend, d, now)

    def in_flight_now(self, backend: Backend) -> InFlight:
        try:
            return self.in_flight(backend)
        except Exception as exc:  # noqa: BLE001 - an unreadable backend is "unknown", never "drained"
            return InFlight(None, None, None, f"reading failed: {exc!r}")

    def watch_drain(self, incident_id: int, backend: Backend) -> None:
        seen = self.in_flight_now(backend)
        verification = None
        if self._drain_ends(backend, seen) and self._needs_recheck(self.store.conn(), incident_id, backend):
            # the alerts resolved meanwhile, or the drain has no starting reading to tell progress from:
            # the pre-drain verification alone is not enough to act on (principle 6)
            verification = self.probing(backend, VERIFY, self.verifier)
        now = self.clock()
        claimed: int | None = None
        unsilence = False
        with self.store.tx() as c:
            inc = Store.incident_in(c, incident_id, DRAINING)
            r = fleet.row(c, backend.name)
            if inc is None:
                return
            if r is None or r["state"] != S.DRAINING.value:
                # not ours to drain any more (refused or changed by hand): stop, say so, retry from scratch
                Store.set_state(c, incident_id, now, OPEN, last_decision="drain_lost", last_note="")
                Store.event(c, now, "lifecycle_refused", backend.name, incident_id,
                            reason=f"incident {incident_id} is draining but the lifecycle is "
                            f"{r['state'] if r else 'missing'}; back to open")
                return
            deadline = float(r["drain_deadline"] or now)
            moved = inflight.moved(inflight.load(r["drain_baseline"]), seen.reading)
            if not seen.drained and not moved and now < deadline:
                c.execute("UPDATE incidents SET next_check_at = ? WHERE id = ?",
                          (now + self.r.poll_interval, incident_id))
                return
            if moved:
                unsilence = True
                fleet.move(c, backend.name, S.READY, now, f"restart called off: {moved}")
                Store.set_state(c, incident_id, now, CLOSED, close_reason=policy.VERIFIED_HEALTHY,
                                last_decision="restart_called_off")
                Store.event(c, now, "restart_called_off", backend.name, incident_id,
                            reason=f"{moved} ({seen.describe()}): not stalled, no restart; incident closed")
            else:
                blocked = policy.gates(self.facts(c, backend, now), self.settings)
                why = ("in-flight work finished" if seen.drained else f"drain timeout, still {seen.describe()}")
                if blocked is not None:
                    unsilence = True
                    fleet.move(c, backend.name, S.READY, now, f"restart called off: {blocked.reason}")
                    Store.set_state(c, incident_id, now, OPEN, last_note="")
                    self._note(c, incident_id, backend.name, blocked, now)
                elif verification is None and self._needs_recheck(c, incident_id, backend):
                    # changed since we looked (e.g. the alert resolved just now): re-verify next poll
                    c.execute("UPDATE incidents SET next_check_at = ? WHERE id = ?", (now, incident_id))
                elif verification is not None:
                    claimed, unsilence = self._after_recheck(c, incident_id, backend, verification, why, now)
                elif self._still_holder(c, now):
                    if fleet.move(c, backend.name, S.STOPPED, now, why, incident_id):
                        d = policy.Decision(policy.RESTART, f"verified before the drain; drained: {why}")
                        claimed = self.claim(c, incident_id, backend, d, now)
        if unsilence:
            self.unsilence_safely(backend.name)
        if claimed is not None:
            self.carry_out(incident_id, claimed, backend, silence=False)

    def _drain_ends(self, backend: Backend, seen: InFlight) -> bool:
        """Read-only: would this look at the drain end it without progress (drained, or deadline)?"""
        r = fleet.row(self.store.conn(), backend.name)
        if r is None or r["state"] != S.DRAINING.value:
            return False
        if inflight.moved(inflight.load(r["drain_baseline"]), seen.reading):
            return False
        return seen.drained or self.clock() >= float(r["drain_deadline"] or 0.0)

    @staticmethod
    def _needs_recheck(c: Any, incident_id: int, backend: Backend) -> bool:
        """Re-verify before claiming: no alert of the incident fires any more, or the drain's starting
        reading failed (so progress during the drain could not be seen)."""
        firing = c.execute("SELECT count(*) FROM incident_alerts WHERE incident_id = ? AND status = 'firing'",
                           (incident_id,)).fetchone()[0]
        r = fleet.row(c, backend.name)
        return not firing or r is None or inflight.load(r["drain_baseline"]) is None

    def _after_recheck(self, c: Any, incident_id: int, backend: Backend, verification: Any, why: str,
                       now: float) -> tuple[int | None, bool]:
        """The drain is over and the backend was verified again: restart, or call it off. Returns
        (claimed action id, whether to remove the silence)."""
        since = self.record_verification(c, incident_id, verification, now)
        d = policy.decide(self.facts(c, backend, now, since), verification, self.settings)
        firing = c.execute("SELECT count(*) FROM incident_alerts WHERE incident_id = ? AND status = 'firing'",
                           (incident_id,)).fetchone()[0]
        if d.kind == policy.RESTART:
            if not self._still_holder(c, now) or not fleet.move(c, backend.name, S.STOPPED, now, why, incident_id):
                return None, False
            d = policy.Decision(policy.RESTART, f"re-verified at the end of the drain ({why}): {d.reason}")
            return self.claim(c, incident_id, backend, d, now), False
        if d.kind in (policy.VERIFIED_HEALTHY, policy.RESTARTED_BY_OTHER):
            fleet.move(c, backend.name, S.READY, now, f"restart called off: {d.reason}")
            Store.set_state(c, incident_id, now, CLOSED, close_reason=d.kind, last_decision=d.kind)
            Store.event(c, now, d.kind, backend.name, incident_id,
                        reason=f"re-verified at the end of the drain{'' if firing else ' (alerts resolved)'}: "
                        f"{d.reason}; incident closed, no restart")
            return None, True
        fleet.move(c, backend.name, S.READY, now, f"restart called off: {d.reason}")
        if not firing:
            Store.set_state(c, incident_id, now, CLOSED, close_reason="resolved", last_decision=d.kind)
            Store.event(c, now, "resolved", backend.name, incident_id,
                        reason=f"alerts resolved during the drain and the re-verification cannot confirm the "
                        f"restart ({d.reason}); incident closed, no restart")
        else:
            Store.set_state(c, incident_id, now, OPEN, last_note="")
            self._note(c, incident_id, backend.name, d, now)
        return None, True

    def claim(self, c: Any, incident_id: int, backend: Backend, d: policy.Decision, now: float) -> int:
        """Record the intent (reserves budget and backoff) and move the incident to RESTARTING."""
        cur = c.execute(
            "INSERT INTO actions (incident_id, backend, argv, holder, started_at) VALUES (?,?,?,?,?)",
            (incident_id, backend.name, " ".join(backend.restart)[:2000], self.holder, now),
        )
        action_id = int(cur.lastrowid or 0)
        st = fleet.state_of(c, backend.name)
        if st == S.ERROR:
            fleet.move(c, backend.name, S.INITIALIZING, now, f"restart started from ERROR: {d.reason}", incident_id)
        elif st == S.INITIALIZING:
            fleet.set_owner(c, backend.name, incident_id)   # never READY yet: the restart takes it over
        Store.set_state(c, incident_id, now, RESTARTING, last_decision=policy.RESTART, last_note="")
        Store.event(c, now, "restarting", backend.name, incident_id, reason=d.reason, action_id=action_id)
        return action_id

    def _note(self, c: Any, incident_id: int, backend: str, d: policy.Decision, now: float) -> None:
        """Record a decision that is not a restart; repeated identical deferrals are logged once."""
        if d.opens_breaker and not Store.breaker(c)["open"]:
            c.execute("UPDATE breaker SET open = 1, opened_at = ?, reason = ? WHERE id = 1", (now, d.reason))
            Store.event(c, now, "breaker_open", backend, incident_id, reason=d.reason)
        if d.kind in (policy.VERIFIED_HEALTHY, policy.RESTARTED_BY_OTHER):
            Store.set_state(c, incident_id, now, CLOSED, close_reason=d.kind, last_decision=d.kind)
            Store.event(c, now, d.kind, backend, incident_id, reason=d.reason + "; incident closed, no restart")
            return
        if d.kind == policy.WOULD_RESTART:
            c.execute("INSERT INTO actions (incident_id, backend, argv, holder, started_at, finished_at, result) "
                      "VALUES (?,?,?,?,?,?, 'dry_run')", (incident_id, backend, "", self.holder, now, now))
            Store.set_state(c, incident_id, now, OBSERVED, last_decision=d.kind)
            Store.event(c, now, d.kind, backend, incident_id, reason="dry run: " + d.reason)
            return
        if d.kind == policy.NOT_CONFIGURED:
            Store.set_state(c, incident_id, now, OBSERVED, last_decision=d.kind)
            Store.event(c, now, d.kind, backend, incident_id, reason=d.reason)
            return
        key = d.kind + (d.reason.split(" until ")[0] if d.kind == policy.DEFERRED_MARKER else "")
        inc = c.execute("SELECT last_note FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        next_check = d.retry_at if d.kind in (policy.DEFERRED_UNKNOWN, DEFERRED_MIN_READY) and d.retry_at else 0.0
        c.execute("UPDATE incidents SET last_note = ?, last_decision = ?, next_check_at = ?, updated_at = ? "
                  "WHERE id = ?", (key, d.kind, next_check, now, incident_id))
        if inc is None or inc["last_note"] != key:
            Store.event(c, now, d.kind, backend, incident_id, reason=d.reason, retry_at=d.retry_at)

    # -- step 2: the action ---------------------------------------------------------------------
    def act(self, incident_id: int, action_id: int, backend: Backend) -> None:
        env = {"LLM_HEALTH_BACKEND": backend.name, "LLM_HEALTH_INCIDENT": str(incident_id),
               "LLM_HEALTH_ACTION": str(action_id)}
        result = self.runner(backend.restart, self.r.action_timeout, env)
        now = self.clock()
        if result.result != act.OK:
            self.unsilence_safely(backend.name)     # nothing to warm up: its alerts must page people again
        with self.store.tx() as c:
            updated = c.execute(
                "UPDATE actions SET result = ?, exit_code = ?, output = ?, finished_at = ? "
                "WHERE id = ? AND result IS NULL", (result.result, result.exit_code, result.output, now, action_id),
            ).rowcount
            detail = {"action_id": action_id, "exit_code": result.exit_code, "output": result.output[-1000:]}
            if not updated:
                Store.event(c, now, "late_result", backend.name, incident_id,
                            reason=f"action finished ({result.result}) after another authority took over",
                            **detail)
                return
            if result.result == act.OK:
                if fleet.state_of(c, backend.name) == S.STOPPED:
                    fleet.move(c, backend.name, S.INITIALIZING, now,
                               f"restart action exited 0; warming up (up to {self.r.warmup_timeout:g}s)",
                               incident_id)
                Store.set_state(c, incident_id, now, WARMING, warm_deadline=now + self.r.warmup_timeout,
                                last_decision="restarted")
                Store.event(c, now, "restarted", backend.name, incident_id,
                            reason=f"restart action exited 0; warming up (up to {self.r.warmup_timeout:g}s)",
                            **detail)
            elif result.outcome_unknown:
                fleet.move(c, backend.name, S.ERROR, now, f"restart action timed out after "
                           f"{self.r.action_timeout:g}s: outcome unknown", incident_id)
                self._escalate(c, backend.name, incident_id, now, "restart action timed out")
                Store.set_state(c, incident_id, now, NEEDS_ACK, last_decision="failed")
                Store.event(c, now, "failed", backend.name, incident_id,
                            reason=f"restart action timed out after {self.r.action_timeout:g}s: outcome unknown, "
                            "not retried (acknowledge via API, or it closes when the backend answers again)",
                            result=result.result, **detail)
            else:
                fleet.move(c, backend.name, S.ERROR, now, f"restart action failed (exit {result.exit_code})",
                           incident_id)
                Store.set_state(c, incident_id, now, OPEN, last_decision="failed", last_note="")
                Store.event(c, now, "failed", backend.name, incident_id,
                            reason=f"restart action failed (exit {result.exit_code}); next attempt only after "
                            "backoff", result=result.result, **detail)

    def carry_out(self, incident_id: int, action_id: int, backend: Backend, *, silence: bool) -> None:
        """Silence (optionally) and run a claimed restart. Anything raising between the claim and the
        recorded result (SQLite busy, the runner failing to start the argv, Alertmanager client errors)
        must not leave the incident RESTARTING, the lifecycle STOPPED and the host mutex held: the
        restart is aborted into needs_ack (outcome unknown, never repeated blindly)."""
        try:
            if silence:
                self.silence(incident_id, backend)
            self.act(incident_id, action_id, backend)
        except Exception as exc:  # noqa: BLE001 - the state machine must always reach a resting state
            log.exception("restart of %s (incident %s, action %s) failed", backend.name, incident_id, action_id)
            self.abort(incident_id, action_id, backend, exc)

    def abort(self, incident_id: int, action_id: int, backend: Backend, exc: BaseException) -> None:
        reason = f"restart aborted by an error of the remediator ({exc.__class__.__name__}: {exc})"[:500]
        try:
            now = self.clock()
            with self.store.tx() as c:
                done = c.execute("UPDATE actions SET result = 'error', finished_at = ?, output = ? "
                                 "WHERE id = ? AND result IS NULL", (now, reason, action_id)).rowcount
                restarting = Store.incident_in(c, incident_id, RESTARTING) is not None
                if restarting:
                    Store.set_state(c, incident_id, now, NEEDS_ACK, last_decision="aborted")
                if done or restarting:
                    if fleet.state_of(c, backend.name) != S.ERROR:
                        fleet.move(c, backend.name, S.ERROR, now, f"{reason}: outcome unknown", incident_id)
                    Store.event(c, now, "aborted", backend.name, incident_id,
                                reason=f"{reason}; the action may or may not have run: not repeated "
                                "(acknowledge via POST /api/backends/<name>/ack, or the incident closes when "
                                "the backend answers again)", action_id=action_id)
                    self._escalate(c, backend.name, incident_id, now, reason)
        except Exception:  # noqa: BLE001 - e.g. the database is still locked: recover() sweeps it next tick
            log.exception("could not record the aborted restart of %s; recovering on the next tick", backend.name)
            self._recovered = False
            return
        self.unsilence_safely(backend.name)

    def silence_safely(self, incident_id: int, backend: Backend) -> None:
        try:
            self.silence(incident_id, backend)
        except Exception:  # noqa: BLE001 - silences never hold a restart back
            log.exception("silencing %s failed", backend.name)

    def unsilence_safely(self, backend: str) -> None:
        try:
            self.unsilence(backend)
        except Exception:  # noqa: BLE001 - the silence ends by itself at its end time
            log.exception("removing the silence of %s failed", backend)

    # -- step 3: warm-up ------------------------------------------------------------------------
    def watch_warmup(self, incident_id: int, backend: Backend, deadline: float) -> None:
        now = self.clock()
        if now > deadline:
            self.unsilence_safely(backend.name)
            with self.store.tx() as c:
                if Store.incident_in(c, incident_id, WARMING) is None:
                    return
                why = f"not warm {self.r.warmup_timeout:g}s after the restart"
                fleet.move(c, backend.name, S.ERROR, now, f"warm-up timeout: {why}", incident_id)
                Store.set_state(c, incident_id, now, NEEDS_ACK, last_decision="warmup_timeout")
                Store.event(c, now, "warmup_timeout", backend.name, incident_id,
                            reason=f"{why}; needs a person, not restarted again")
                self._escalate(c, backend.name, incident_id, now, f"warm-up timeout: {why}")
            return
        ready, why = self.probing(backend, WARMUP, self.warmup_check)
        if ready:
            self.unsilence_safely(backend.name)
        now = self.clock()
        with self.store.tx() as c:
            if Store.incident_in(c, incident_id, WARMING) is None:
                return
            if ready:
                if fleet.state_of(c, backend.name) == S.INITIALIZING:
                    fleet.move(c, backend.name, S.READY, now, f"warm: {why}", incident_id)
                Store.set_state(c, incident_id, now, CLOSED, close_reason="recovered", last_decision="recovered")
                Store.event(c, now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
            else:
                c.execute("UPDATE incidents SET next_check_at = ?, last_note = ? WHERE id = ?",
                          (now + self.r.warmup_poll, why[:200], incident_id))

    def watch_recovery(self, incident_id: int, backend: Backend) -> None:
        """An incident with an unknown outcome closes by itself once the backend answers again."""
        ready, why = self.probing(backend, WARMUP, self.warmup_check)
        if ready:
            self.unsilence_safely(backend.name)
        now = self.clock()
        with self.store.tx() as c:
            if Store.incident_in(c, incident_id, NEEDS_ACK) is None:
                return
            if ready:
                st = fleet.state_of(c, backend.name)
                if st in (S.ERROR, S.STOPPED):
                    fleet.move(c, backend.name, S.INITIALIZING, now, f"answers again: {why}", incident_id)
                if fleet.state_of(c, backend.name) == S.INITIALIZING:
                    fleet.move(c, backend.name, S.READY, now, f"warm: {why}", incident_id)
                Store.set_state(c, incident_id, now, CLOSED, close_reason="recovered", last_decision="recovered")
                Store.event(c, now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
            else:
                c.execute("UPDATE incidents SET next_check_at = ? WHERE id = ?",
                          (now + self.r.warmup_poll, incident_id))

    # -- silences -----------------------------------------------------------------------------------
    def silence(self, incident_id: int, backend: Backend) -> None:
        """Mute the backend's alerts for the whole restart (it ends by itself if we crash). Failures are
        recorded and never hold the restart back."""
        am = self.r.alertmanager_url
        if not am:
            return
        seconds = self.r.drain_timeout + self.r.action_timeout + self.r.warmup_timeout + SILENCE_MARGIN
        try:
            sid = create_silence(am, backend.name, seconds / 60.0,
                                 f"llm-health remediator: restart of {backend.name} (incident {incident_id})",
                                 "llm-health-remediator", timeout=SILENCE_TIMEOUT)
        except SilenceError as exc:
            now = self.clock()
            with self.store.tx() as c:
                Store.bump(c, "silences", "create_failed")
                Store.event(c, now, "silence_failed", backend.name, incident_id,
                            reason=f"could not silence the restart's alerts (restart goes on): {exc}")
            return
        now = self.clock()
        with self.store.tx() as c:
            c.execute("INSERT OR REPLACE INTO silences (id, backend, incident_id, created_at, ends_at) "
                      "VALUES (?,?,?,?,?)", (sid, backend.name, incident_id, now, now + seconds))
            Store.bump(c, "silences", "created")
            Store.event(c, now, "silence_created", backend.name, incident_id,
                        reason=f"alerts with backend={backend.name} silenced for {seconds:g}s (id {sid})",
                        silence_id=sid)

    def unsilence(self, backend: str) -> None:
        am = self.r.alertmanager_url
        rows = self.store.conn().execute("SELECT * FROM silences WHERE backend = ? AND expired_at IS NULL",
                                         (backend,)).fetchall()
        for s in rows:
            try:
                if not am:
                    raise SilenceError("remediator.alertmanager_url is no longer set")
                known = expire_silence(am, s["id"], timeout=SILENCE_TIMEOUT)
            except SilenceError as exc:
                now = self.clock()
                with self.store.tx() as c:
                    Store.bump(c, "silences", "expire_failed")
                    Store.event(c, now, "silence_expire_failed", backend, s["incident_id"],
                                reason=f"could not expire silence {s['id']} (it ends by itself at its end "
                                f"time): {exc}", silence_id=s["id"])
                    if now >= float(s["ends_at"]):
                        c.execute("UPDATE silences SET expired_at = ?, result = 'ended' WHERE id = ?", (now, s["id"]))
                continue
            now = self.clock()
            with self.store.tx() as c:
                c.execute("UPDATE silences SET expired_at = ?, result = ? WHERE id = ?",
                          (now, "expired" if known else "gone", s["id"]))
                Store.bump(c, "silences", "expired")
                Store.event(c, now, "silence_expired", backend, s["incident_id"],
                            reason=f"silence {s['id']} removed: the restart is over", silence_id=s["id"])

    def _close(self, incident_id: int, backend: str, kind: str, reason: str) -> None:
        now = self.clock()
        with self.store.tx() as c:
            Store.set_state(c, incident_id, now, CLOSED, close_reason=reason)
            Store.event(c, now, kind, backend, incident_id, reason=reason)


def state_path(config: Config) -> Path:
    return config.resolve_path(config.remediator.state)
