"""The one restart authority: who may act (the lease), what survives us (recover), and the wiring.

Every gunicorn worker runs an `Authority`; only the holder of the SQLite lease acts. The parts:

* remediator/restart/: ONE incident's procedure, one module per step (consider -> verify -> floor ->
  silence -> drain -> claim -> act -> warm up), each step with its inputs and its one transaction.
* remediator/scheduler.py: many incidents at once: a keyed queue (one key per backend, never two
  threads on one key) and `max_concurrent_incidents` workers; every open incident is looked at on
  its own cadence (`poll_interval`), so a slow step of one never delays another.
* this module: the lease (monotonic, clock.py), `recover()` after taking the lease (collect the real
  outcome of actions a previous holder started; only what cannot be known becomes "interrupted"),
  backends outside any restart (start-up warm-up, ERROR), and the default checks and runner.

Every claim (OPEN -> RESTARTING) is an atomic state transition inside BEGIN IMMEDIATE that re-reads the
fleet (host mutex, min_ready, restarts in progress, budget, backoff, breaker) and records the intent
(an `actions` row, which is what the budget and backoff count) BEFORE the argv runs, so two threads,
two authorities, or one that crashed mid-restart can never repeat a restart.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llm_health.exporter.backend import HttpFailure, Target
from llm_health.exporter.observation import Verification, VerifyOutcome
from llm_health.remediator import action as act
from llm_health.remediator import clock as clocks_mod
from llm_health.remediator import inflight, lifecycle, policy
from llm_health.remediator.backend_io import (
    WARMUP,
    BackendIO,
    InFlightReader,
    Runner,
    Verifier,
    WarmupCheck,
    probe_log,
    probing,
)
from llm_health.remediator.clock import Clocks
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.act import record_result
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.notes import escalate
from llm_health.remediator.restart.reconcile import Reconciler
from llm_health.remediator.restart.result import seconds_until
from llm_health.remediator.restart.silences import SILENCE_TIMEOUT, unsilence_safely
from llm_health.remediator.scheduler import Scheduler
from llm_health.remediator.store import (
    Action,
    ActionResultKind,
    IncidentState,
    Lease,
    StateStore,
    Transaction,
    state_path,
)

from llm_health.config import Backend, Config, RemediatorSettings

log = logging.getLogger("llm_health.remediator")

LEASE = "authority"
S = LifecycleState
ERROR_LOOK_MIN = 30.0          # an ERROR backend gets a full warm-up check at most this often ...
ERROR_LOOK_POLLS = 6           # ... or every warmup_poll * this, whichever is longer
LOOK_SLACK = 60.0              # seconds a look may need beyond its I/O deadlines (SQLite busy, a loaded CPU)


def install_probe_counter() -> None:
    """Count every generation request exporter.check.verify sends on our behalf (principle 2): its
    `Prober` is wrapped so that each `probe()` is noted in the calling thread's `probe_log` (a no-op
    for anyone else, e.g. the exporter). The procedure turns the notes into SQLite counters."""
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
            sink = probe_log.get()
            if sink is not None:
                sink.append("probe")       # counted before it goes out: a probe that fails was sent too
            return super().probe(*args, **kwargs)

    check.Prober = CountingProber


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

    def verify_backend(backend: Backend) -> Verification:
        try:
            from llm_health.exporter.check import verify
        except ImportError as exc:
            return Verification(VerifyOutcome.UNKNOWN, f"verifier unavailable: {exc}")
        if key_problem:
            return Verification(VerifyOutcome.UNKNOWN, key_problem)
        extra: dict[str, Any] = {}
        if api_key and "api_key" in inspect.signature(verify).parameters:
            extra["api_key"] = api_key
        try:
            return verify(
                backend.url, readings=max(2, r.verify_readings), interval=r.verify_interval,
                read_timeout=config.exporter.read_timeout, probe_timeout=config.exporter.probe_timeout,
                sleep=time.sleep, clock=time.time, model=backend.model,
                stall_ceiling=config.exporter.stall_ceiling, **extra,
            )
        except Exception as exc:  # noqa: BLE001 - a broken verifier must never mean "restart"
            return Verification(VerifyOutcome.UNKNOWN, f"verification raised {exc!r}")

    return verify_backend


def default_answer_check(config: Config) -> WarmupCheck:
    """/health 200 and /v1/models 200 listing the configured model; no generation request. Used for a
    backend seen for the first time (start-up: INITIALIZING -> READY). Each request has a total
    deadline (read_timeout): a server that drips its answer costs at most that."""
    timeout = config.exporter.read_timeout

    def check(backend: Backend) -> tuple[bool, str]:
        target = Target(backend.url, timeout)
        try:
            health = target.get("/health")
            if health.status != 200:
                return False, f"/health answered {health.status}"
            models = target.get("/v1/models")
            if models.status != 200:
                return False, f"/v1/models answered {models.status}"
            if backend.model:
                data = models.json().get("data", [])
                ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
                if backend.model not in ids:
                    return False, f"/v1/models does not list {backend.model!r} yet"
        except HttpFailure as exc:
            return False, f"not answering: {exc.kind}: {exc.detail}"
        except (ValueError, AttributeError) as exc:
            return False, f"/v1/models unreadable: {exc.__class__.__name__}"
        finally:
            target.close()
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
        if v.outcome in policy.HEALTHY_OUTCOMES:
            return True, f"answers again: /health, /v1/models, verify {v.outcome}"
        return False, f"verify {v.outcome}: {v.reason}"

    return check


def default_in_flight(config: Config) -> InFlightReader:
    r = config.remediator

    def read(backend: Backend) -> InFlight:
        sock = str(config.resolve_path(r.haproxy_socket)) if r.haproxy_socket else ""
        return inflight.read_in_flight(backend, config.exporter.read_timeout, sock, r.haproxy_proxy)

    return read


class ActionRunner:
    """The default runner: the argv runs through action.py's wrapper; its pid, output and exit status
    go to files under `folder` (next to the state file), named by the action id, so that a later
    authority can collect the result of an action this one did not live to see finish."""

    keeps_files = True

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, argv: Sequence[str], timeout: float, env: dict[str, str]) -> act.ActionResult:
        return act.run_action(argv, timeout, env, folder=self.folder, key=env.get("LLM_HEALTH_ACTION", "action"))


def action_dir(config: Config) -> Path:
    state = state_path(config)
    return state.with_name(state.name + ".actions")


class Authority:
    def __init__(
        self,
        store: StateStore,
        config: Config,
        *,
        verifier: Verifier | None = None,
        warmup_check: WarmupCheck | None = None,
        clock: Callable[[], float] = time.time,
        runner: Runner | None = None,
        holder: str | None = None,
        answer_check: WarmupCheck | None = None,
        in_flight: InFlightReader | None = None,
        mono: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        r = config.remediator
        self.clocks: Clocks = clocks_mod.injected(clock, mono)
        self.clock = clock
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        verifier = verifier or default_verifier(config)
        io = BackendIO(
            verifier=verifier,
            warmup_check=warmup_check or default_warmup_check(config, verifier),
            answer_check=answer_check or default_answer_check(config),
            in_flight=in_flight or default_in_flight(config),
            runner=runner or ActionRunner(action_dir(config)),
        )
        self.ctx = Context(store, config, io, self.clocks, self.holder, self._still_holder, action_dir(config),
                           on_abort_unrecorded=self._recover_again)
        self.reconciler = Reconciler(self.ctx)
        self.lease_ttl = max(5.0, 10 * r.poll_interval)
        self._next_look: dict[str, float] = {}   # backend -> when (monotonic) to check its lifecycle again
        self._stop = threading.Event()
        self._holding = threading.Event()
        self._recovered = False
        self._recover_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.last_pass = time.monotonic()        # end of the latest resync / tick; read by /healthz (health.py)
        self.scheduler = Scheduler(keys=self._due_keys, work=self.work, workers=r.max_concurrent_incidents,
                                   resync_every=r.poll_interval, clock=self.clocks.mono)

    @property
    def config(self) -> Config:
        return self.ctx.config

    @property
    def r(self) -> RemediatorSettings:
        return self.ctx.config.remediator

    # -- the injectable checks (kept on the context) ------------------------------------------------
    def _check(name: str) -> property:  # noqa: N805 - a property factory used in the class body
        return property(lambda self: getattr(self.ctx.io, name),
                        lambda self, value: setattr(self.ctx.io, name, value))

    verifier = _check("verifier")
    warmup_check = _check("warmup_check")
    answer_check = _check("answer_check")
    in_flight = _check("in_flight")
    runner = _check("runner")
    del _check

    def probing(self, backend: Backend, purpose: str, check: Callable[[Backend], Any]) -> Any:
        return probing(self.store, backend, purpose, check)

    def look_bound(self, acting: bool) -> float:
        """The longest one look at one key may take with these settings, every I/O at its deadline: a
        verification (readings apart, each read with its cheap checks, two probes), the warm-up's answer
        check, an in-flight read, four Alertmanager calls, SQLite's busy timeout, and the restart action
        when it runs in this look. /healthz fails, naming the key, past it."""
        r, e = self.r, self.config.exporter
        read = 3 * e.read_timeout                              # /metrics, then /health and /v1/models
        verify = max(2, r.verify_readings) * (r.verify_interval + read) + 2 * (e.probe_timeout + e.read_timeout)
        verify += e.stall_ceiling * (1 + read / max(r.verify_interval, 1e-3))  # readings extended for a long step
        silences = 4 * SILENCE_TIMEOUT if r.alertmanager_url else 0.0
        look = 2 * e.read_timeout + verify + read + silences + LOOK_SLACK
        return look + (r.action_timeout if acting else 0.0)

    def stuck_looks(self) -> dict[str, float]:
        """Keys a worker has had for longer than look_bound(): {key: seconds}."""
        acting = self.ctx.running.backends()
        return {key: age for key, age in self.scheduler.queue.processing_for().items()
                if age > self.look_bound(key in acting)}

    # -- threads ------------------------------------------------------------------------------------
    def start(self) -> None:
        t = threading.Thread(target=self._lease_loop, name="remediator-lease", daemon=True)
        t.start()
        self._threads.append(t)
        self.scheduler.start()

    def stop(self) -> None:
        self._stop.set()
        self.scheduler.stop()
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

    # -- the lease (monotonic: a step of the wall clock neither steals nor extends it) ---------------
    def renew_lease(self) -> bool:
        now, t, boot = self.clocks.wall(), self.clocks.mono(), self.clocks.boot
        with self.store.tx() as tx:
            row = tx.lease(LEASE)
            other_boot = row is not None and row.boot != boot    # its expiry is another boot's clock
            if row is None or row.holder == self.holder or other_boot or row.expires_at < t:
                tx.put_lease(Lease(LEASE, self.holder, t + self.lease_ttl, boot))
                lapsed = row is not None and row.holder == self.holder and row.expires_at < t
                if lapsed:
                    self._recovered = False  # ours again after it lapsed: what ran meanwhile may be unrecorded
                if row is None or row.holder != self.holder:
                    self._recovered = False  # newly ours: look for restarts a previous holder left unfinished
                    if other_boot:
                        tx.rebase_deadlines(t, t + self.r.warmup_timeout)
                    tx.event(now, "lease_acquired", reason=f"{self.holder} is the restart authority",
                             previous=row.holder if row else None)
                self._holding.set()
                return True
        self._holding.clear()
        return False

    def _still_holder(self, tx: Transaction) -> bool:
        row = tx.lease(LEASE)
        return (row is not None and row.holder == self.holder and row.boot == self.clocks.boot
                and row.expires_at >= self.clocks.mono())

    # -- scheduling: what is due, and one look at one key -------------------------------------------
    def _due_keys(self) -> list[str]:
        """The resync: every backend with an active incident, and every backend outside a restart whose
        lifecycle needs a look now (first seen, or in ERROR). One key per backend: each is looked at by
        one worker, so one slow or hostile backend holds one worker, never the others' looks."""
        if not self._holding.is_set():
            self.last_pass = time.monotonic()
            return []
        self._recover_if_needed()
        incidents = [inc.backend for inc in self.store.active_incidents()]
        busy = set(incidents)
        keys = incidents + [name for name in self.lifecycle_due() if name not in busy]
        self.last_pass = time.monotonic()
        return keys

    def work(self, key: str) -> float | None:
        """One look at one backend; seconds until it wants another look (None: at the next resync)."""
        if self._stop.is_set() or not self._holding.is_set():
            return None
        inc = self.store.active_incident(key)
        if inc is None:
            self.look_after_lifecycle(key)
            return None
        t = self.clocks.mono()
        due = inc.next_check_at
        if due > t:
            return due - t
        return seconds_until(self.reconciler.look(inc), self.clocks.mono())

    def tick(self) -> None:
        """One synchronous pass over everything that is due (tests drive the authority with this; the
        running authority uses the scheduler, which does the same per key, concurrently)."""
        if not self._holding.is_set():
            return
        self._recover_if_needed()
        self.look_after_lifecycles((S.INITIALIZING,))   # cheap: /health and /v1/models, never a probe
        for inc in self.store.active_incidents():
            if self._stop.is_set() or not self._holding.is_set():
                return
            if inc.next_check_at <= self.clocks.mono():
                self.reconciler.look(inc)
        self.look_after_lifecycles((S.ERROR,))          # full warm-up checks, after the incidents
        self.last_pass = time.monotonic()

    # -- after taking the lease: what a previous holder left unfinished ------------------------------
    def _recover_if_needed(self) -> None:
        with self._recover_lock:
            if not self._recovered:
                self.recover()
                self._recovered = True

    def _recover_again(self) -> None:
        self._recovered = False

    def recover(self) -> None:
        """Actions another (dead) holder started and never finished. Their result is COLLECTED when it can
        still be known: the action's wrapper outlives the authority and writes the exit status to a file
        (action.py); one still running is left to `Procedure.watch_action`. Only an action whose outcome
        cannot be known (no status, wrapper gone; or an injected runner) is `interrupted`: counted (it is
        already in the budget), never repeated, its backend to ERROR (needs a person). A drain in
        progress simply resumes."""
        now = self.clocks.wall()
        interrupted: set[str] = set()
        collected: list[tuple[Action, act.ActionResult]] = []
        with self.store.tx() as tx:
            # our own unfinished rows too: one of ours that no worker is running is a restart whose
            # bookkeeping failed (see Procedure.carry_out)
            for a in tx.unfinished_actions():
                if a.id in self.ctx.running:
                    continue
                if a.status_path:
                    path = Path(a.status_path)
                    result = act.collect(act.ActionFiles(path.parent, path.name.removesuffix(".status")))
                    if result is None:
                        continue                       # still running: collected when it ends
                    if not result.outcome_unknown or result.result == act.TIMEOUT:
                        collected.append((a, result))
                        continue
                tx.finish_action(a.id, now, ActionResultKind.INTERRUPTED)
                if tx.incident_in(a.incident_id, IncidentState.RESTARTING) is not None:
                    tx.move_incident(a.incident_id, now, IncidentState.NEEDS_ACK, last_decision="interrupted")
                tx.event(now, "interrupted", a.backend, a.incident_id,
                         reason="the remediator stopped while this restart was running and its exit status "
                         "cannot be known: it may have happened; not repeated (acknowledge via POST "
                         "/api/backends/<name>/ack, or the incident closes when the backend answers again "
                         "or the alert resolves)",
                         action_id=a.id, holder=a.holder, own=a.holder == self.holder)
                if tx.lifecycle_state(a.backend) != S.ERROR:
                    tx.move_lifecycle(a.backend, S.ERROR, now, "interrupted mid-restart: outcome unknown",
                                      a.incident_id)
                escalate(tx, a.backend, a.incident_id, now, "restart interrupted: outcome unknown")
                interrupted.add(a.backend)
        for a, result in collected:
            record_result(self.ctx, a.incident_id, a.id, a.backend, result, collected=True)
        for backend in sorted(interrupted):
            unsilence_safely(self.ctx, backend)      # ERROR: its alerts must reach people again

    # -- lifecycle outside a restart ----------------------------------------------------------------
    def lifecycle_due(self, states: tuple[LifecycleState, ...] = (S.INITIALIZING, S.ERROR)) -> list[str]:
        """Backends no restart of ours is carrying whose lifecycle wants a look now, the longest waiting
        first: a backend seen for the first time (INITIALIZING, every `warmup_poll`), an ERROR backend
        without an active incident (at most every max(ERROR_LOOK_MIN, warmup_poll * ERROR_LOOK_POLLS))."""
        now, t = self.clocks.wall(), self.clocks.mono()
        rows = self.store.lifecycles()
        missing = [b.name for b in self.config.backends if b.name not in rows]
        if missing:
            with self.store.tx() as tx:
                for name in missing:
                    tx.ensure_lifecycle(name, now)
            rows = self.store.lifecycles()
        active = {i.backend: i for i in self.store.active_incidents()}
        due: list[str] = []
        for b in self.config.backends:
            r = rows.get(b.name)
            if r is None or r.owned:
                continue
            st = r.state
            inc = active.get(b.name)
            if st not in states or (inc is not None and inc.restart_under_way):
                continue
            if (st == S.INITIALIZING or (st == S.ERROR and inc is None)) and \
                    self._next_look.get(b.name, float("-inf")) <= t:
                due.append(b.name)
        return sorted(due, key=lambda name: self._next_look.get(name, float("-inf")))

    def look_after_lifecycles(self, states: tuple[LifecycleState, ...] = (S.INITIALIZING, S.ERROR)) -> None:
        """Every due lifecycle look, one after another (tick(); the scheduler does them concurrently)."""
        for name in self.lifecycle_due(states):
            if self._stop.is_set():
                return
            self.look_after_lifecycle(name, states)

    def look_after_lifecycle(self, name: str,
                             states: tuple[LifecycleState, ...] = (S.INITIALIZING, S.ERROR)) -> None:
        """One backend outside any restart: seen for the first time, it becomes READY once it answers
        /health and /v1/models (or ERROR after warmup_timeout); in ERROR with its incident acknowledged,
        READY again once it is warm (full warm-up check, which may send a probe). Every check has a
        total deadline, and what it found is written only if nothing else took the backend meanwhile."""
        b = self.config.backend(name)
        if b is None:
            return
        r = self.store.lifecycle(name)
        inc = self.store.active_incident(name)
        if r is None or r.owned or (inc is not None and inc.restart_under_way):
            return
        st = r.state
        if st not in states or (st == S.ERROR and inc is not None) or \
                self._next_look.get(name, float("-inf")) > self.clocks.mono():
            return
        since = r.since
        pause = self.r.warmup_poll if st == S.INITIALIZING else max(ERROR_LOOK_MIN,
                                                                     self.r.warmup_poll * ERROR_LOOK_POLLS)
        try:
            if st == S.ERROR:
                ready, why = probing(self.store, b, WARMUP, self.ctx.io.warmup_check)
            else:
                ready, why = self.ctx.io.answer_check(b)
        except Exception as exc:  # noqa: BLE001 - one broken backend never starves the others
            log.exception("lifecycle check of %s failed", name)
            ready, why = False, f"check raised {exc.__class__.__name__}: {exc}"[:300]
        now, t = self.clocks.wall(), self.clocks.mono()
        self._next_look[name] = t + pause
        with self.store.tx() as tx:
            r = tx.lifecycle(name)
            if r is None or r.state != st or r.owned:
                return
            if ready:
                if st == S.ERROR:
                    tx.move_lifecycle(name, S.INITIALIZING, now, f"out of ERROR: {why}")
                tx.move_lifecycle(name, S.READY, now, why)
            elif st == S.INITIALIZING and lifecycle.warmup_expired(since, now, self.r.warmup_timeout):
                tx.move_lifecycle(name, S.ERROR, now, f"not answering {self.r.warmup_timeout:g}s after it "
                                  f"was first seen: {why}")
                escalate(tx, name, None, now, f"{name} never became ready: {why}")
