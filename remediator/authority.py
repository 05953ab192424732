"""The one restart authority, wired: who may act, what it looks at, and the threads that do it.

Every gunicorn worker builds an `Authority` (remediator/services.py starts it after the fork); only the
holder of the store's lease acts. The parts, each in its own module:

* lease.py: the lease (monotonic; taken, renewed every ttl/4, checked inside every claim);
* recovery.py: the first thing a new holder does: collect the outcome of actions a previous one left;
* restart/: ONE incident's procedure, one module per step; `Reconciler.look(incident)` picks the step;
* lifecycle_watch.py: backends outside any restart (first seen, ERROR);
* rollout/: rolling operations, one key per active rollout (`rollout:<id>`): they ask for restarts, the
  restarts themselves go through the same incidents, gates and claims as every other;
* scheduler.py: many keys at once: a keyed queue (one key per backend, never two threads on one key) and
  `max_concurrent_incidents` workers; a resync every poll_interval adds every key that is due;
* backend_io.py: the checks and the runner (injectable; the defaults count their probes).

`work(key)` is the one path from a key to a look, for the scheduler's workers and for the tests alike.

Every claim (OPEN -> RESTARTING) is an atomic state transition inside one write transaction that re-reads
the fleet (host mutex, min_ready, restarts in progress, budget, backoff, breaker, the lease) and records the
intent (an `actions` row, which is what the budget and backoff count) BEFORE the argv runs, so two threads,
two authorities, or one that crashed mid-restart can never repeat a restart.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from llm_health.config import Config
from llm_health.remediator import clock as clocks_mod
from llm_health.remediator.backend_io import (
    InFlightReader,
    Runner,
    Verifier,
    WarmupCheck,
    action_dir,
    default_io,
    diagnostics_dir,
)
from llm_health.remediator.lease import AuthorityLease
from llm_health.remediator.lifecycle_watch import LifecycleWatch
from llm_health.remediator.recovery import Recovery
from llm_health.remediator.restart.context import Context, NotLeading
from llm_health.remediator.restart.reconcile import Reconciler
from llm_health.remediator.restart.result import seconds_until
from llm_health.remediator.restart.silences import SILENCE_TIMEOUT
from llm_health.remediator.rollout.procedure import GateQueries, Procedure
from llm_health.remediator.scheduler import Scheduler
from llm_health.remediator.store import StateStore
from llm_health.remediator.store.single_writer import single_writer

log = logging.getLogger("llm_health.remediator")

ROLLOUT_KEY = "rollout:"         # a rollout's scheduler key (a backend's name never holds ':', config.NAME_RE)


def rollout_key(rollout_id: int) -> str:
    return f"{ROLLOUT_KEY}{rollout_id}"


def rollout_of_key(key: str) -> int | None:
    return int(key[len(ROLLOUT_KEY):]) if key.startswith(ROLLOUT_KEY) else None


LOOK_SLACK = 60.0              # seconds a look may need beyond its I/O deadlines (SQLite busy, a loaded CPU)


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
        first_seen_check: WarmupCheck | None = None,
        in_flight: InFlightReader | None = None,
        mono: Callable[[], float] | None = None,
        gate: GateQueries | None = None,
    ) -> None:
        r = config.remediator
        store = single_writer(store)     # its write transactions queue here, one in the store's queue at a time
        self.store = store
        self.clock = clock
        self.clocks = clocks_mod.injected(clock, mono)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.io = default_io(store, config, verifier=verifier, warmup_check=warmup_check, first_seen_check=first_seen_check,
                             in_flight=in_flight, runner=runner)
        self.lease = AuthorityLease(store, self.clocks, self.holder, ttl=max(5.0, 10 * r.poll_interval),
                                    warmup_timeout=r.warmup_timeout)
        self.ctx = Context(store, config, self.io, self.clocks, self.holder, self.lease.holds, self.lease.spare,
                           self.lease.term, action_dir(config),
                           diagnostics_dir(config))
        self.recovery = Recovery(self.ctx)
        self.lease.on_new_term = self.recovery.again
        self.ctx.on_abort_unrecorded = self.recovery.again
        self.reconciler = Reconciler(self.ctx)
        self.lifecycles = LifecycleWatch(self.ctx)
        self.rollouts = Procedure(self.ctx, gate)
        self.scheduler = Scheduler(keys=self.due_keys, work=self.work, workers=r.max_concurrent_incidents,
                                   resync_every=r.poll_interval, clock=self.clocks.mono)
        self.last_pass = time.monotonic()        # end of the latest resync; read by /healthz (health.py)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- threads ------------------------------------------------------------------------------------
    def start(self) -> None:
        t = threading.Thread(target=self.lease.keep, args=(self._stop,), name="remediator-lease", daemon=True)
        t.start()
        self._threads.append(t)
        self.scheduler.start()

    def stop(self) -> None:
        self._stop.set()
        self.scheduler.stop()
        for t in self._threads:
            t.join(timeout=5)

    # -- what is due, and one look at one key ---------------------------------------------------------
    def due_keys(self) -> list[str]:
        """The resync: every backend with an active incident, and every backend outside a restart whose
        lifecycle needs a look now (first seen, or in ERROR). One key per backend: each is looked at by
        one worker, so one slow or hostile backend holds one worker, never the others' looks."""
        if not self.lease.holding.is_set():
            self.last_pass = time.monotonic()
            return []
        try:
            self.recovery.if_needed()
            due = self.lifecycles.due()
        except NotLeading as exc:      # deposed: nothing written, no look handed out
            log.warning("resync stopped, nothing written: %s", exc)
            return []
        incidents = [inc.backend for inc in self.store.active_incidents()]
        busy = set(incidents)
        keys = incidents + [name for name in due if name not in busy]
        keys += [rollout_key(r.id) for r in self.store.active_rollouts()]
        self.last_pass = time.monotonic()
        return keys

    def work(self, key: str) -> float | None:
        """One look at one backend; seconds until it wants another look (None: at the next resync)."""
        if self._stop.is_set() or not self.lease.holding.is_set():
            return None
        with self.lease.look():        # every write of this look is fenced on the term it begins in
            try:
                return self._look(key)
            except NotLeading as exc:  # deposed mid-look: it wrote nothing; the lease thread takes it back or not
                log.warning("look at %s stopped, nothing written: %s", key, exc)
                return None

    def _look(self, key: str) -> float | None:
        rollout_id = rollout_of_key(key)
        if rollout_id is not None:
            return self.rollouts.look(rollout_id)
        inc = self.store.active_incident(key)
        if inc is None:
            self.lifecycles.look(key)
            return None
        t = self.clocks.mono()
        if inc.next_check_at > t:
            return inc.next_check_at - t
        return seconds_until(self.reconciler.look(inc), self.clocks.mono())

    # -- how long a look may take (health.py) -----------------------------------------------------------
    def look_bound(self, acting: bool) -> float:
        """The longest one look at one key may take with these settings, every I/O at its deadline: a
        verification (readings apart, each read with its cheap checks, two probes), the warm-up's answer
        check, an in-flight read, four Alertmanager calls, SQLite's busy timeout, and the restart action
        when it runs in this look. /healthz fails, naming the key, past it."""
        r, e = self.ctx.r, self.ctx.config.exporter
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
