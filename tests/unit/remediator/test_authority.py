"""Incidents progress concurrently (issue 11): a running Authority (its scheduler, worker threads and
lease thread, real clocks) with injected verifier, in-flight reader, warm-up check and a restart runner
that takes its time. The webhook, the store and every guarantee are the real ones.

* 10 backends needing a restart at once, each on its own host: their ten verifications and then their ten
  restart actions are all under way at the same moment (each waits at a barrier for the other nine, so
  one run after another, or a few at a time, breaks the barrier and fails), and every restart starts
  within a small constant of its alert.
* two backends on one host are still restarted one at a time;
* min_ready and the fleet breaker hold while incidents race for the claim.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from llm_health.config import RemediatorSettings, parse_config
from llm_health.drill.procs import wait_until
from llm_health.exporter.observation import Verification
from llm_health.remediator import action
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import OUT_OF_SERVICE
from llm_health.remediator.store import SqliteStore
from tests.support import stores
from tests.support.alerts import alert, payload

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

TOKEN = "concurrency-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLACK = 8.0     # seconds from an alert to its restart: scheduling, the store, a loaded 2-core machine


@dataclass
class Fleet:
    client: FlaskClient
    authority: Authority
    store: SqliteStore
    names: tuple[str, ...]
    outcomes: dict[str, str]
    starts: dict[str, list[float]] = field(default_factory=dict)     # monotonic action start times
    ends: dict[str, list[float]] = field(default_factory=dict)
    most_out: int = 0           # most backends out of service at once (sampled only when the test asks)
    acting: int = 0                                                    # restart actions running now
    most_acting: int = 0                                               # most restart actions running at once
    sampling: bool = True
    released: threading.Event = field(default_factory=threading.Event)  # set: verifications end at once
    barriers: dict[str, threading.Barrier] = field(default_factory=dict)   # "verify", "act": see `together`
    broken: list[str] = field(default_factory=list)                    # barriers that timed out

    def meet(self, what: str) -> None:
        """Wait until `together` verifications (or actions) are under way at once; a timeout is recorded."""
        try:
            self.barriers[what].wait()
        except threading.BrokenBarrierError:
            self.broken.append(what)

    def alert_all(self, names: tuple[str, ...]) -> float:
        at = time.monotonic()
        body = payload(*(alert(n) for n in names))
        assert self.client.post("/webhook", json=body, headers=AUTH).status_code == 202
        return at

    def states(self) -> dict[str, str]:
        with self.store.reader() as rd:
            return {n: rd.lifecycle_state(n).value for n in self.names}

    def kinds(self, name: str) -> list[str]:
        return [e.kind for e in self.store.events(backend=name, limit=1000)]

    def sample(self) -> None:
        while self.sampling:
            out = sum(1 for s in self.states().values() if s in {x.value for x in OUT_OF_SERVICE})
            self.most_out = max(self.most_out, out)
            time.sleep(0.01)


@contextmanager
def running_fleet(tmp_path: Path, n: int, *, hosts: list[str] | None = None, verify_seconds: float,
                  action_seconds: float, outcome: str, restart_fixes: bool = True, sample_out: bool = False,
                  together: int = 0, exporter: dict[str, Any] | None = None, **remediator: Any) -> Iterator[Fleet]:
    """`sample_out`: count the backends out of service every 10 ms (`most_out`); a query per backend each
    time, so only the tests that assert it pay for it. `together`: a verification, then an action, ends
    once `together` of them are under way at once (at most `verify_seconds` / `action_seconds` later: then
    the barrier breaks, and `broken` says so), not after a fixed time."""
    names = tuple(f"gpu-{i:02d}" for i in range(n))
    (tmp_path / "token").write_text(TOKEN)
    settings = {"state": "state.db", "token_file": "token", "verify_interval": 0.2, "poll_interval": 0.1,
                "warmup_timeout": 60, "warmup_poll": 0.1, "action_timeout": 60, "stalled_drain_timeout": 0.3,
                "backoff": {"initial": 0, "factor": 2, "cap": 0, "stable_after": 3600},
                "budget": {"restarts": 100, "window": 3600}, "breaker": {"restarts": 100, "window": 3600},
                "max_concurrent_incidents": 16, "max_concurrent_restarts": 16, **remediator}
    config = parse_config({
        "backends": [{"name": name, "url": f"http://127.0.0.1:{18300 + i}",
                      "host": (hosts[i] if hosts else f"node-{i}"), "restart": [f"restart-{name}"]}
                     for i, name in enumerate(names)],
        "remediator": settings,
        "exporter": exporter or {},
    }, source=str(tmp_path / "llm-health.yml"))
    app = create_app(config, with_authority=False)
    store = app.extensions["remediator"].store
    outcomes = dict.fromkeys(names, outcome)
    world: Fleet
    lock = threading.Lock()

    def verifier(b: Any) -> Verification:
        if together:
            world.meet("verify")
        else:
            world.released.wait(verify_seconds)      # a verification that takes its time (ended at teardown)
        return Verification(outcomes[b.name], "scripted verification")

    def runner(argv: Any, timeout: float, env: dict[str, str]) -> action.ActionResult:
        name = env["LLM_HEALTH_BACKEND"]
        with lock:
            world.starts.setdefault(name, []).append(time.monotonic())
            world.acting += 1
            world.most_acting = max(world.most_acting, world.acting)
        if together:
            world.meet("act")
        else:
            time.sleep(action_seconds)
        if restart_fixes:
            outcomes[name] = "progress"              # the restart fixed it
        with lock:
            world.acting -= 1
            world.ends.setdefault(name, []).append(time.monotonic())
        return action.ActionResult(action.OK, 0, "restarted")

    authority = Authority(store, config, runner=runner, holder="concurrency-test", verifier=verifier,
                          warmup_check=lambda b: (outcomes[b.name] == "progress", "scripted warm-up"),
                          first_seen_check=lambda b: (True, "answers"),
                          in_flight=lambda b: InFlight(None, None, None, "not read"))
    world = Fleet(app.test_client(), authority, store, names, outcomes,
                  barriers={"verify": threading.Barrier(together or 1, timeout=verify_seconds),
                            "act": threading.Barrier(together or 1, timeout=action_seconds)})
    authority.start()
    sampler = threading.Thread(target=world.sample, daemon=True)
    try:
        wait_until(lambda: set(world.states().values()) == {"ready"}, timeout=20, what="every backend READY")
        if sample_out:
            sampler.start()
        yield world
    finally:
        world.sampling = False
        world.released.set()
        for barrier in world.barriers.values():
            barrier.abort()                          # nothing waits for a partner that never comes
        authority.stop()
        if sampler.is_alive():
            sampler.join(timeout=5)


def test_ten_restarts_start_within_one_verification_of_their_alert(tmp_path: Path) -> None:
    # a verification ends only when all ten are under way, and an action only when all ten are running: one
    # after another, or a few at a time, the first would wait out its barrier's 20 s, past SLACK
    with running_fleet(tmp_path, 10, verify_seconds=20.0, action_seconds=20.0, outcome="down", together=10) as f:
        alerted = f.alert_all(f.names)
        wait_until(lambda: len(f.starts) == 10, timeout=120, interval=0.05, what="10 restarts started")
        delays = sorted(f.starts[n][0] - alerted for n in f.names)
        assert delays[-1] < SLACK, delays
        wait_until(lambda: len(f.ends) == 10, timeout=60, interval=0.05, what="10 restarts ended")
        # all ten verifications, then all ten actions, ran at the same moment: none waited for another's
        assert f.broken == [] and f.most_acting == 10, (f.broken, f.most_acting, delays)
        wait_until(lambda: all("recovered" in f.kinds(n) for n in f.names), timeout=60, what="all recovered")
        assert all(len(f.starts[n]) == 1 for n in f.names)         # one restart per incident


def test_two_backends_on_one_host_restart_one_at_a_time(tmp_path: Path) -> None:
    with running_fleet(tmp_path, 2, hosts=["node-x", "node-x"], verify_seconds=0.3, action_seconds=0.5,
                       outcome="down", sample_out=True) as f:
        f.alert_all(f.names)
        wait_until(lambda: all("recovered" in f.kinds(n) for n in f.names), timeout=60, what="both recovered")
        first, second = sorted(f.names, key=lambda n: f.starts[n][0])
        assert f.starts[second][0] >= f.ends[first][0]            # never two restarts on one host at once
        assert f.most_out == 1
        assert "deferred_host" in f.kinds(second)


def test_min_ready_holds_while_incidents_race(tmp_path: Path) -> None:
    # 5 serving backends that stall at once, min_ready 3: at most 2 may be out of service at any moment
    with running_fleet(tmp_path, 5, verify_seconds=0.2, action_seconds=0.5, outcome="no_progress",
                       min_ready=3, sample_out=True) as f:
        f.alert_all(f.names)
        wait_until(lambda: all("recovered" in f.kinds(n) for n in f.names), timeout=90, what="all recovered")
        assert 1 <= f.most_out <= 2, f.most_out
        assert any("deferred_min_ready" in f.kinds(n) for n in f.names)
        assert all(len(f.starts[n]) == 1 for n in f.names)


def test_breaker_is_never_exceeded_when_incidents_race(tmp_path: Path) -> None:
    # 10 backends down at once, verified at the same moment, all racing for the claim: the breaker allows 3
    with running_fleet(tmp_path, 10, verify_seconds=1.0, action_seconds=0.5, outcome="down",
                       breaker={"restarts": 3, "window": 3600}) as f:
        f.alert_all(f.names)

        def settled() -> bool:
            kinds = {n: f.kinds(n) for n in f.names}
            done = [n for n in f.names if "recovered" in kinds[n]]
            held = [n for n in f.names if "deferred_breaker" in kinds[n]]
            return len(done) + len(held) == len(f.names)
        wait_until(settled, timeout=60, what="every incident restarted or held by the breaker")
        actions = stores.sql(f.store).execute("SELECT count(*) FROM actions").fetchone()[0]
        breaker_open = f.store.breaker().open
        assert actions == 3 and sum(len(v) for v in f.starts.values()) == 3
        assert breaker_open
        assert len(f.store.events(kind="breaker_open")) == 1


DEFAULTS = RemediatorSettings()


def test_a_hundred_refused_backends_all_get_their_first_restart_within_a_few_verify_windows(tmp_path: Path) -> None:
    """A rack failure: 100 backends refuse connections and do not come back after their restart. The
    warm-up held a restart slot for up to warmup_timeout, so 8 restarted, the rest waited 900 s per wave
    (about 3 hours for the last). A backend verified down serves nothing: its restart takes no slot."""
    verify = 0.2
    with running_fleet(tmp_path, 100, verify_seconds=verify, action_seconds=0.1, outcome="down",
                       restart_fixes=False, max_concurrent_restarts=DEFAULTS.max_concurrent_restarts,
                       max_concurrent_incidents=DEFAULTS.max_concurrent_incidents,
                       restart_slot_warmup=DEFAULTS.restart_slot_warmup, warmup_timeout=DEFAULTS.warmup_timeout) as f:
        alerted = f.alert_all(f.names)
        # 100 verifications on 16 workers are 7 rounds of one verification each; a few more for the rest
        bound = 7 * verify + 20
        wait_until(lambda: len(f.starts) == 100, timeout=bound, interval=0.2, what="100 first restarts")
        assert max(f.starts[n][0] for n in f.names) - alerted < bound
        assert all(len(f.starts[n]) == 1 for n in f.names)          # one restart each, none repeated


def test_a_warm_up_that_does_not_come_back_frees_its_slot_after_restart_slot_warmup(tmp_path: Path) -> None:
    """20 serving backends stall at once and none comes back after its restart: 8 at a time take capacity,
    and each frees its slot restart_slot_warmup after its action, not at warmup_timeout."""
    slot = 0.5          # restart_slot_warmup
    with running_fleet(tmp_path, 20, verify_seconds=0.2, action_seconds=0.1, outcome="no_progress",
                       restart_fixes=False, max_concurrent_restarts=8, restart_slot_warmup=slot,
                       warmup_timeout=120) as f:
        alerted = f.alert_all(f.names)
        wait_until(lambda: len(f.starts) == 20, timeout=60, interval=0.05, what="20 first restarts")
        starts = sorted(f.starts[n][0] - alerted for n in f.names)
        assert starts[-1] < 40, starts                                 # 3 waves of ~1 s, never 120 s
        assert starts[8] - starts[0] >= 0.75 * slot, starts            # the 9th waited for a slot to free
        assert any("deferred_concurrency" in f.kinds(n) for n in f.names)


def test_healthz_fails_naming_the_backend_while_a_worker_is_stuck(tmp_path: Path, monkeypatch: Any) -> None:
    """/healthz was stamped by the resync thread, which never blocks: it said ok for 80 s while every
    worker was stuck. Now a look running past what its I/O deadlines allow fails it, naming the key."""
    from llm_health.remediator import authority as authority_mod

    monkeypatch.setattr(authority_mod, "LOOK_SLACK", 0.0)
    fast = {"read_timeout": 0.1, "probe_timeout": 0.1, "stall_after": 0.3, "stall_ceiling": 0.3, "stall_floor": 0.3}
    with running_fleet(tmp_path, 2, verify_seconds=30.0, action_seconds=0.1, outcome="down", exporter=fast,
                       verify_readings=2, verify_interval=0.3, action_timeout=1) as f:
        health = f.client.application.extensions["remediator"].health
        health.authority = f.authority
        assert f.client.get("/healthz").status_code == 200
        bound = f.authority.look_bound(False)
        assert bound < 15, bound                        # every I/O of a look at its deadline
        f.alert_all(("gpu-00",))                        # its verification hangs for 30 s (a bug, a wedged call)

        def failing() -> dict[str, Any] | None:
            r = f.client.get("/healthz")
            return r.get_json() if r.status_code == 503 else None

        report = wait_until(failing, timeout=bound + 20, interval=0.2, what="/healthz failing")
        assert any("'gpu-00'" in p and "stuck" in p for p in report["problems"]), report
        assert report["stuck_looks"] == 1 and report["oldest_look_seconds"] >= bound - 0.1   # rounded to 0.1 s
        text = f.client.get("/metrics").get_data(as_text=True)
        assert "llm_health_remediator_stuck_looks 1.0" in text and "llm_health_remediator_healthy 0" in text
