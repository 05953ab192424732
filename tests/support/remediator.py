"""The one in-process remediator of the tests: the real app, store, webhook, API and Authority, driven
pass by pass with a fake clock.

`build()` makes a `World`: the Flask test client of a real `create_app()` (nothing started unless
asked), its SQLite store, and an `Authority` whose backend I/O the World scripts: `outcomes` (what a
verification finds), `ready` (warm-up, and answers when the World scripts those), `work` and `tokens`
(the in-flight reading, when scripted), and a runner that records every restart (`calls`: its argv,
`restarted`: its backend, `envs`: its environment) and returns `result`. A pass goes through the
production path, `Authority.work(key)` for every due key (tests.support.alerts.one_pass).

The worlds the tests use:
* `four_backends()`: gpu-a, gpu-b and gpu-c with restart actions, gpu-n without; none warm; the
  in-flight reading and the answer check are the default I/O (their ports are closed);
* `fleet()`: named backends (on hosts, if given) that serve: READY after the first look, the answer
  check and the in-flight reading (work and token counters) scripted;
* `discovered()`: backends from discovery only, served by a Prometheus stand-in on loopback
  (`FakePrometheus`), with this worker's discovery refresher running.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from llm_health.config import Config, parse_config
from llm_health.drill.procs import wait_until
from llm_health.exporter.observation import Verification
from llm_health.exporter.reading import EngineReading, Reading
from llm_health.httpserver import QuietHandler
from llm_health.remediator import action
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lease import NAME as LEASE_NAME
from llm_health.remediator.store import Event, Incident, StateStore
from tests.support import stores
from tests.support.alerts import one_pass
from tests.support.discovery import K8S
from tests.support.fakes import FakeClock
from tests.support.loopback import Loopback

TOKEN = "remediator-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

Check = Callable[[Any], tuple[bool, str]]
InFlightReader = Callable[[Any], InFlight]


def reading(work: float, tokens: float) -> Reading:
    """A vLLM v1 reading with `work` requests running and `tokens` generated so far."""
    engine = EngineReading(running=work, kv_usage=0.2, counters={"generation_tokens": tokens})
    return Reading("v1", {"0": engine}, process_start=1.0)


class FakePrometheus:
    """GET /api/v1/targets on 127.0.0.1: the targets given, counting queries; `open` cleared holds answers."""

    def __init__(self) -> None:
        self.targets: list[dict[str, Any]] = []
        self.queries = 0
        self.open = threading.Event()
        self.open.set()
        self.lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with outer.lock:
                    outer.queries += 1
                outer.open.wait(30)
                self.reply_json(200, {"status": "success", "data": {"activeTargets": outer.targets}})

        self.server = Loopback(Handler)
        self.url = self.server.url

    def close(self) -> None:
        self.open.set()
        self.server.stop()


@dataclass
class World:
    client: FlaskClient
    app: Flask
    authority: Authority
    store: StateStore
    clock: FakeClock
    config: Config
    outcomes: dict[str, str]
    ready: dict[str, bool]
    work: dict[str, float]
    tokens: dict[str, float]
    mono: FakeClock | None = None
    prometheus: FakePrometheus | None = None
    calls: list[tuple[str, ...]] = field(default_factory=list)     # the argv of every restart action run
    restarted: list[str] = field(default_factory=list)             # the backend of each
    envs: list[dict[str, str]] = field(default_factory=list)
    result: action.ActionResult = action.ActionResult(action.OK, 0, "ok")
    verifications: int = 0

    # -- what arrives
    def post(self, body: Any, headers: dict[str, str] | None = None) -> Any:
        """POST a notification to the webhook (with the token unless `headers` are given); the response."""
        return self.client.post("/webhook", json=body, headers=AUTH if headers is None else headers)

    def deliver(self, body: Any) -> None:
        """POST a notification to the webhook, which must accept it (202)."""
        assert self.post(body).status_code == 202

    def pass_time(self, seconds: float) -> None:
        """`seconds` pass: on the fake clocks, and on the lease's clock when the store has its own (PostgreSQL:
        the database's, which a test cannot move, so the stored expiry moves back instead)."""
        self.clock.advance(seconds)
        if self.mono is not None:
            self.mono.advance(seconds)
        with self.store.tx() as tx:
            if tx.lease_clock() is not None:
                row = tx.lease(LEASE_NAME)
                if row is not None:
                    tx.put_lease(dataclasses.replace(row, expires_at=row.expires_at - seconds))

    # -- the authority's passes
    def run(self, ticks: int = 3) -> None:
        for _ in range(ticks):
            assert self.authority.lease.renew()      # the lease thread's job in production
            one_pass(self.authority)

    def run_until(self, done: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
        """Authority passes (the fake clock moves half a second after each) until `done()` is truthy."""
        def step() -> Any:
            assert self.authority.lease.renew()
            one_pass(self.authority)
            self.clock.advance(0.5)
            return done()
        return wait_until(step, timeout=timeout, interval=0.0, what=what)

    # -- what the store says
    def kinds(self, backend: str = "") -> list[str]:
        """The kinds of the audit events about `backend` (every event when empty), oldest first."""
        return [e.kind for e in reversed(self.store.events(backend=backend, limit=1000))]

    def events(self, backend: str, kind: str) -> list[Event]:
        return self.store.events(backend=backend, kind=kind, limit=1000)

    def incident(self, backend: str = "gpu-a") -> Incident | None:
        """The backend's active incident."""
        return self.store.active_incident(backend)

    def last_incident(self, backend: str = "gpu-a") -> Any:
        """The backend's latest incident row, closed or not."""
        return stores.sql(self.store).execute("SELECT * FROM incidents WHERE backend = ? ORDER BY id DESC LIMIT 1",
                                         (backend,)).fetchone()

    def state(self, name: str = "gpu-a") -> str:
        return self.store.lifecycle_state(name).value

    def steps(self, name: str = "gpu-a") -> list[tuple[str, str]]:
        """The backend's lifecycle transitions (source, target), oldest first."""
        return [(e.detail["source"], e.detail["target"])
                for e in reversed(self.store.events(backend=name, kind="lifecycle", limit=1000))]

    # -- discovery
    @property
    def discovery(self) -> Any:
        return self.app.extensions["remediator"].discovery

    def publish(self, *targets: dict[str, Any]) -> None:
        """New targets, and wait until this worker's discovery has an answer that started after them."""
        assert self.prometheus is not None
        self.prometheus.targets = list(targets)
        mark = self.discovery.mark()
        self.discovery.request_refresh()
        wait_until(lambda: self.discovery.answered_since(mark), timeout=10, what="discovery refreshed")

    def close(self) -> None:
        if self.prometheus is not None:
            self.discovery.stop()
            self.prometheus.close()
        self.store.close()


def build(tmp_path: Path, document: Mapping[str, Any], *, outcomes: Mapping[str, str] | None = None,
          ready: Mapping[str, bool] | None = None, scripted_serving: bool = False,
          first_seen_check: Check | None = None, in_flight: InFlightReader | None = None,
          mono: FakeClock | None = None, holder: str = "test-authority", start_services: bool = False,
          first_look: bool = False, prometheus: FakePrometheus | None = None) -> World:
    """A World over the configuration `document` (relative paths from `tmp_path`, the token in
    tmp_path/token).

    Verification finds `outcomes[name]` ("down" for a name not in it), warm-up `ready[name]` (False if
    not in it). `scripted_serving`: the answer check says `ready[name]` too, and the in-flight reading
    is `work[name]` requests with `tokens[name]` generated (1 and 100 to begin with); `first_seen_check` and
    `in_flight` replace either; otherwise both are the default I/O. `mono`: a monotonic clock of its own
    (else the wall clock serves both). `start_services`: the worker's services start as under gunicorn
    (discovery's first refresh, then its refresher). `first_look`: one pass right away, after which
    every backend must be READY; otherwise only the lease is taken."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    url = stores.postgres_url()     # the `store_kind` fixture's PostgreSQL database, when in effect
    if url is not None:
        document = {**document, "remediator": {**dict(document.get("remediator") or {}), "state": url}}
    config = parse_config(dict(document), source=str(tmp_path / "llm-health.yml"))
    clock = FakeClock()
    app = create_app(config, clock=clock, with_authority=False)
    ctx = app.extensions["remediator"]
    config = ctx.config          # with discovery on: the live fleet (configured + discovered backends)
    if start_services:
        ctx.services.start()
    names = [b.name for b in config.backends]
    world: World

    def verifier(backend: Any) -> Verification:
        world.verifications += 1
        return Verification(world.outcomes.get(backend.name, "down"), "fake verifier")

    def warmup(backend: Any) -> tuple[bool, str]:
        return world.ready.get(backend.name, False), "fake warm-up"

    def answers(backend: Any) -> tuple[bool, str]:
        return world.ready[backend.name], "fake answers"

    def work(backend: Any) -> InFlight:
        n = world.work[backend.name]
        return InFlight(n, None, reading(n, world.tokens[backend.name]))

    def runner(argv: Any, timeout: float, env: dict[str, str]) -> action.ActionResult:
        world.calls.append(tuple(argv))
        world.restarted.append(env["LLM_HEALTH_BACKEND"])
        world.envs.append(env)
        return world.result

    authority = Authority(ctx.store, config, verifier=verifier, warmup_check=warmup, clock=clock, mono=mono,
                          runner=runner, holder=holder,
                          first_seen_check=first_seen_check or (answers if scripted_serving else None),
                          in_flight=in_flight or (work if scripted_serving else None))
    world = World(app.test_client(), app, authority, ctx.store, clock, config, dict(outcomes or {}),
                  dict(ready or {}), dict.fromkeys(names, 1.0), dict.fromkeys(names, 100.0), mono=mono,
                  prometheus=prometheus)
    if first_look:
        world.run(1)
        assert {world.state(n) for n in names} == {"ready"}
    else:
        assert authority.lease.renew()
    return world


FOUR_BACKENDS = [
    {"name": "gpu-a", "url": "http://127.0.0.1:18001", "restart": ["restart-a", "--now"]},
    {"name": "gpu-b", "url": "http://127.0.0.1:18002", "restart": ["restart-b"]},
    {"name": "gpu-c", "url": "http://127.0.0.1:18003", "restart": ["restart-c"]},
    {"name": "gpu-n", "url": "http://127.0.0.1:18004"},
]


def four_backends(tmp_path: Path, **remediator: Any) -> World:
    """gpu-a (restart-a --now), gpu-b and gpu-c with restart actions, gpu-n without; gpu-a and gpu-b
    verify as no_progress, gpu-c and gpu-n as down; none is warm. `remediator` overrides settings."""
    settings = {
        "state": "state.db", "token_file": "token", "busy_dir": "busy", "dedup_window": 60,
        "verify_interval": 0.2, "poll_interval": 0.1, "warmup_timeout": 100, "warmup_poll": 5,
        "action_timeout": 5,
        "backoff": {"initial": 100, "factor": 2, "cap": 1000, "stable_after": 5000},
        "budget": {"restarts": 3, "window": 10000},
        "breaker": {"restarts": 5, "window": 10000},
        **remediator,
    }
    return build(tmp_path, {"backends": FOUR_BACKENDS, "remediator": settings},
                 outcomes={"gpu-a": "no_progress", "gpu-b": "no_progress", "gpu-c": "down", "gpu-n": "down"},
                 ready={"gpu-a": False, "gpu-b": False, "gpu-c": False, "gpu-n": False})


def fleet(tmp_path: Path, names: Sequence[str] = ("gpu-a", "gpu-b"), hosts: Mapping[str, str] | None = None,
          **remediator: Any) -> World:
    """Backends `names` (restart-<name>; on `hosts[name]` if given) that serve: every one READY after
    the first look, verified no_progress, warm, with one request in flight. A stall drains for 5 s
    (stalled_drain_timeout), any other drain for 60 s. `remediator` overrides settings."""
    document = {
        "backends": [{"name": n, "url": f"http://127.0.0.1:{18100 + i}", "host": (hosts or {}).get(n, ""),
                      "restart": [f"restart-{n}"]} for i, n in enumerate(names)],
        "remediator": {"state": "state.db", "token_file": "token", "verify_interval": 0.2,
                       "poll_interval": 0.1, "warmup_timeout": 100, "warmup_poll": 5, "action_timeout": 30,
                       "drain_timeout": 60, "stalled_drain_timeout": 5,
                       "backoff": {"initial": 10, "factor": 2, "cap": 100, "stable_after": 5000},
                       **remediator},
    }
    return build(tmp_path, document, outcomes=dict.fromkeys(names, "no_progress"),
                 ready=dict.fromkeys(names, True), scripted_serving=True, holder="test", first_look=True)


def discovered(tmp_path: Path, **discovery: Any) -> World:
    """No configured backend: discovery reads Kubernetes pod targets from a FakePrometheus (restart:
    restart-pod {namespace} {pod}); a discovered backend verifies as down and never warms up.
    `discovery` overrides discovery settings."""
    prometheus = FakePrometheus()
    document = {
        "discovery": {
            "prometheus_url": prometheus.url, "refresh": 3600, "extra_refresh_every": 0.05, "timeout": 30,
            "name_from": "__meta_kubernetes_pod_name", "placeholders": K8S,
            "restart": ["restart-pod", "{namespace}", "{pod}"], **discovery,
        },
        "remediator": {
            "state": "state.db", "token_file": "token", "dedup_window": 60, "verify_interval": 0.2,
            "poll_interval": 0.1, "warmup_timeout": 100, "warmup_poll": 5, "action_timeout": 5,
            "backoff": {"initial": 100, "factor": 2, "cap": 1000, "stable_after": 5000},
        },
    }
    try:
        return build(tmp_path, document, start_services=True, prometheus=prometheus)
    except BaseException:
        prometheus.close()
        raise
