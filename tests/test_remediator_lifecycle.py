"""The lifecycle inside the remediator, in-process: Flask test client + an Authority driven tick by tick
with a fake clock. Verifier, warm-up check, in-flight reader and action runner are injected (recorded);
SQLite, the webhook, the API, /metrics, the status page and the agent are the real ones. Silences go to a
real Alertmanager 0.25 process; KV usage is read from a real in-process simulator.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient
from llm_health.exporter.observation import Verification
from llm_health.exporter.reading import EngineReading, Reading
from llm_health.remediator import action
from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import AgentCheckServer
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.store import SqliteStore
from llm_health.simulator.server import SimConfig, Simulator

from llm_health.config import Config, parse_config
from llm_health.drill.procs import ManagedProcess, free_port, wait_until
from tests.support.alerts import alert, one_pass, payload
from tests.support.fakes import FakeClock, has_sample

S = LifecycleState
TOKEN = "lifecycle-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AM_BINARY = shutil.which("prometheus-alertmanager")


def reading(work: float, tokens: float) -> Reading:
    return Reading("v1", {"0": EngineReading(running=work, kv_usage=0.2, counters={"generation_tokens": tokens})},
                   process_start=1.0)


@dataclass
class World:
    client: FlaskClient
    authority: Authority
    store: SqliteStore
    clock: FakeClock
    config: Config
    outcomes: dict[str, str]
    ready: dict[str, bool]
    work: dict[str, float]
    tokens: dict[str, float]
    calls: list[str] = field(default_factory=list)
    result: action.ActionResult = action.ActionResult(action.OK, 0, "ok")

    def post(self, body: Any) -> None:
        assert self.client.post("/webhook", json=body, headers=AUTH).status_code == 202

    def run(self, ticks: int = 3) -> None:
        for _ in range(ticks):
            assert self.authority.lease.renew()
            one_pass(self.authority)

    def state(self, name: str = "gpu-a") -> str:
        return self.store.lifecycle_state(name).value

    def steps(self, name: str = "gpu-a") -> list[tuple[str, str]]:
        return [(e.detail["source"], e.detail["target"])
                for e in reversed(self.store.events(backend=name, kind="lifecycle", limit=1000))]

    def kinds(self, name: str = "gpu-a") -> list[str]:
        return [e.kind for e in reversed(self.store.events(backend=name, limit=1000))]


def build(tmp_path: Path, names: tuple[str, ...] = ("gpu-a", "gpu-b"), hosts: dict[str, str] | None = None,
          **remediator: Any) -> World:
    (tmp_path / "token").write_text(TOKEN)
    config = parse_config({
        "backends": [{"name": n, "url": f"http://127.0.0.1:{18100 + i}", "host": (hosts or {}).get(n, ""),
                      "restart": [f"restart-{n}"]} for i, n in enumerate(names)],
        "remediator": {"state": "state.db", "token_file": "token", "verify_interval": 0.2, "poll_interval": 0.1,
                       "warmup_timeout": 100, "warmup_poll": 5, "action_timeout": 30, "drain_timeout": 60,
                       "stalled_drain_timeout": 5,
                       "backoff": {"initial": 10, "factor": 2, "cap": 100, "stable_after": 5000}, **remediator},
    }, source=str(tmp_path / "llm-health.yml"))
    clock = FakeClock()
    app = create_app(config, clock=clock, with_authority=False)
    store = app.extensions["remediator"].store
    outcomes = dict.fromkeys(names, "no_progress")
    ready = dict.fromkeys(names, True)
    work = dict.fromkeys(names, 1.0)
    tokens = dict.fromkeys(names, 100.0)
    world: World

    def runner(argv: Any, timeout: float, env: dict[str, str]) -> action.ActionResult:
        world.calls.append(env["LLM_HEALTH_BACKEND"])
        return world.result

    authority = Authority(
        store, config, clock=clock, runner=runner, holder="test",
        verifier=lambda b: Verification(outcomes[b.name], "fake verifier"),
        warmup_check=lambda b: (ready[b.name], "fake warm-up"),
        answer_check=lambda b: (ready[b.name], "fake answers"),
        in_flight=lambda b: InFlight(work[b.name], None, reading(work[b.name], tokens[b.name])),
    )
    world = World(app.test_client(), authority, store, clock, config, outcomes, ready, work, tokens)
    world.run(1)                                    # first look: every backend READY
    assert {world.state(n) for n in names} == {"ready"}
    return world


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = build(tmp_path)
    yield world
    world.store.close()


def restart_cycle(w: World, name: str = "gpu-a") -> None:
    """From an alert to READY again: stalled (work stays 1, counters frozen) -> drain timeout -> restart."""
    w.ready[name] = False
    w.post(payload(alert(name)))
    w.run()
    assert w.state(name) == "draining"
    w.clock.advance(5)                             # stalled_drain_timeout
    w.run()
    assert w.state(name) == "initializing"
    w.ready[name] = True
    w.clock.advance(5)
    w.run()
    assert w.state(name) == "ready"


# -- the cycle and what shows it --------------------------------------------------------------------------
def test_restart_goes_through_every_state_and_every_view_shows_it(w: World) -> None:
    w.ready["gpu-a"] = False
    w.post(payload(alert()))
    w.run()
    assert w.state() == "draining" and w.calls == []
    view = {b["backend"]: b for b in w.client.get("/api/backends").get_json()["backends"]}
    assert view["gpu-a"]["lifecycle"]["state"] == "draining"
    assert view["gpu-a"]["lifecycle"]["since"] == w.clock.t
    assert view["gpu-a"]["incident"]["state"] == "draining"
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="draining"} 1')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="ready"} 0')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-b",state="ready"} 1')
    assert has_sample(metrics, f'llm_health_remediator_lifecycle_since_timestamp_seconds{{backend="gpu-a"}} {w.clock.t:.3f}')
    assert b"DRAINING" in w.client.get("/").data
    w.clock.advance(4.9)                           # stalled: waits only stalled_drain_timeout (5 s)
    w.run()
    assert w.state() == "draining" and w.calls == []
    w.clock.advance(0.2)
    w.run()
    assert w.calls == ["gpu-a"] and w.state() == "initializing"
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.steps() == [("initializing", "ready"), ("ready", "draining"), ("draining", "stopped"),
                         ("stopped", "initializing"), ("initializing", "ready")]
    kinds = w.kinds()
    assert kinds.index("draining") < kinds.index("restarting") < kinds.index("restarted") < kinds.index("recovered")
    assert w.store.active_incident("gpu-a") is None


def test_verified_down_skips_the_drain(w: World) -> None:
    w.outcomes["gpu-a"] = "down"
    w.post(payload(alert()))
    w.run()
    assert w.steps()[1] == ("ready", "stopped")    # nothing to drain
    assert w.calls == ["gpu-a"]


def test_drain_ends_when_nothing_is_in_flight_any_more(w: World) -> None:
    w.post(payload(alert()))
    w.run()
    assert w.state() == "draining"
    w.work["gpu-a"] = 0.0                          # gone (e.g. cancelled by the client), counters unchanged
    w.clock.advance(0.2)
    w.run()
    assert w.calls == ["gpu-a"] and w.steps()[2] == ("draining", "stopped")
    assert any(e.reason == "draining -> stopped: in-flight work finished"
               for e in w.store.events(kind="lifecycle", backend="gpu-a"))


def test_progress_during_the_drain_calls_the_restart_off(w: World) -> None:
    w.post(payload(alert()))
    w.run()
    assert w.state() == "draining"
    w.tokens["gpu-a"] += 5                         # the in-flight request finishes: the engine moved
    w.work["gpu-a"] = 0
    w.clock.advance(0.2)
    w.run()
    assert w.calls == [] and w.state() == "ready"
    assert w.steps()[-2:] == [("ready", "draining"), ("draining", "ready")]
    assert "restart_called_off" in w.kinds() and w.store.active_incident("gpu-a") is None


def test_illegal_transition_is_refused_and_audited(w: World) -> None:
    with w.store.tx() as tx:
        assert not tx.move_lifecycle("gpu-a", S.INITIALIZING, w.clock.t, "skip the drain")
    assert w.state() == "ready"
    refused = w.store.events(kind="lifecycle_refused")
    assert len(refused) == 1 and "ready -> initializing" in refused[0].reason
    assert 'decision="lifecycle_refused"} 1' in w.client.get("/metrics").get_data(as_text=True)


# -- gates -------------------------------------------------------------------------------------------------
def test_per_host_mutex_defers_the_second_backend(tmp_path: Path) -> None:
    w = build(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), hosts={"gpu-a": "n1", "gpu-b": "n1", "gpu-c": "n2"})
    w.post(payload(alert("gpu-a"), alert("gpu-b"), alert("gpu-c")))
    w.run()
    assert (w.state("gpu-a"), w.state("gpu-b"), w.state("gpu-c")) == ("draining", "ready", "draining")
    deferred = w.store.events(kind="deferred_host")
    assert [e.backend for e in deferred] == ["gpu-b"] and "gpu-a on the same host n1" in deferred[0].reason
    w.ready["gpu-a"] = w.ready["gpu-c"] = False
    w.clock.advance(5)
    w.run()
    assert w.state("gpu-a") == "initializing" and w.state("gpu-b") == "ready"    # still waiting
    w.run(5)
    assert len(w.store.events(kind="deferred_host")) == 1                      # logged once
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.state("gpu-a") == "ready" and w.state("gpu-b") == "draining"


def test_min_ready_floor_and_the_down_exception(tmp_path: Path) -> None:
    w = build(tmp_path, min_ready=1)
    w.post(payload(alert("gpu-a"), alert("gpu-b")))
    w.run()
    assert (w.state("gpu-a"), w.state("gpu-b")) == ("draining", "ready")
    assert [e.backend for e in w.store.events(kind="deferred_min_ready")] == ["gpu-b"]
    w.outcomes["gpu-b"] = "down"                   # gpu-b goes down: restarting it costs no capacity
    w.ready["gpu-b"] = False
    w.clock.advance(1)
    w.run()
    assert w.state("gpu-b") == "initializing" and ("ready", "stopped") in w.steps("gpu-b")
    assert w.calls == ["gpu-b"]


# -- failures and escalation ------------------------------------------------------------------------------
def test_warmup_timeout_is_error_escalated_and_not_restarted_in_a_loop(w: World) -> None:
    w.ready["gpu-a"] = False
    w.post(payload(alert()))
    w.run()
    w.clock.advance(5)
    w.run()
    assert w.state() == "initializing"
    w.clock.advance(101)
    w.run()
    assert w.state() == "error" and w.steps()[-1] == ("initializing", "error")
    assert "escalated" in w.kinds() and "warmup_timeout" in w.kinds()
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, 'llm_health_remediator_escalations_total{backend="gpu-a"} 1')
    assert has_sample(metrics, 'llm_health_remediator_lifecycle_state{backend="gpu-a",state="error"} 1')
    page = w.client.get("/").get_data(as_text=True)
    assert "ERROR" in page and "escalated" in page
    w.clock.advance(10_000)
    w.post(payload(alert(starts_at="2026-11-30T09:00:00Z")))
    w.run(5)
    assert w.calls == ["gpu-a"]                   # never restarted again by itself
    assert w.client.post("/api/backends/gpu-a/ack", headers=AUTH).status_code == 200
    w.run()
    assert w.state() == "error"                   # acknowledged, but not warm yet
    w.ready["gpu-a"] = True
    w.clock.advance(29)                           # an ERROR backend is checked at most every 30 s
    w.run()
    assert w.state() == "error"
    w.clock.advance(1)
    w.run()
    assert w.state() == "ready" and w.steps()[-2:] == [("error", "initializing"), ("initializing", "ready")]


def test_failed_action_is_error_and_the_next_restart_starts_from_it(w: World) -> None:
    w.result = action.ActionResult(action.FAILED, 2, "nope")
    w.ready["gpu-a"] = False
    w.post(payload(alert()))
    w.run()
    w.clock.advance(5)
    w.run()
    assert w.state() == "error" and w.calls == ["gpu-a"]
    w.result = action.ActionResult(action.OK, 0, "ok")
    w.clock.advance(11)                           # backoff
    w.run()
    assert w.calls == ["gpu-a", "gpu-a"] and w.steps()[-1] == ("error", "initializing")
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.state() == "ready"


def test_lifecycle_survives_a_crash_and_every_process_answers_the_same(tmp_path: Path) -> None:
    w = build(tmp_path)
    w.post(payload(alert()))
    w.run()
    assert w.state() == "draining"
    # the process dies; another one (another worker, or after a restart) opens the same state file
    other_app = create_app(w.config, clock=w.clock, with_authority=False)
    other = other_app.test_client()
    assert other.get("/api/backends").get_json()["backends"] == w.client.get("/api/backends").get_json()["backends"]
    agents = [AgentAnswers(SqliteStore(w.store.path), w.config, kv_reader=lambda url: 0.2) for _ in range(2)]
    assert {a.status_for("gpu-a").state for a in agents} == {S.DRAINING}
    second = Authority(SqliteStore(w.store.path), w.config, clock=w.clock, holder="second", runner=w.authority.io.runner,
                       verifier=w.authority.io.verifier, warmup_check=w.authority.io.warmup_check,
                       answer_check=w.authority.io.answer_check, in_flight=w.authority.io.in_flight)
    w.clock.advance(w.authority.lease.ttl + 1)
    assert second.lease.renew()
    w.clock.advance(5)
    one_pass(second)                                 # resumes the drain where it was: deadline passed
    assert w.calls == ["gpu-a"] and w.state() == "initializing"


# -- the agent, over TCP, from SQLite -----------------------------------------------------------------------
def ask(port: int, name: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(name.encode() + b"\n")
        return s.makefile().readline().strip()


def test_agent_answers_from_sqlite_with_kv_from_the_backend(tmp_path: Path) -> None:
    sim = Simulator(SimConfig(port=free_port(), model="gpu-a")).start()
    servers: list[AgentCheckServer] = []
    try:
        wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator")
        w = build(tmp_path)
        config = parse_config({"backends": [{"name": "gpu-a", "url": sim.url}, {"name": "gpu-b",
                               "url": "http://127.0.0.1:18101"}], "remediator": {"state": w.store.path}})
        for _ in range(2):   # two processes' worth of agents, each with its own store handle
            servers.append(AgentCheckServer("127.0.0.1", 0, AgentAnswers(SqliteStore(w.store.path), config).status_for)
                           .start())
        answers = lambda name: {ask(s.port, name) for s in servers}  # noqa: E731
        assert answers("gpu-a") == {"ready up 100%"}           # KV 0 from the simulator's own /metrics
        assert answers("nope") == {"down #unknown backend"}
        w.post(payload(alert("gpu-a")))
        assert answers("gpu-a") == {"ready up 100%"}           # an unverified alert never takes it out
        w.run()
        assert answers("gpu-a") == {"drain"}
        w.clock.advance(5)
        w.ready["gpu-a"] = False
        w.run()
        assert answers("gpu-a") == {"down #initializing: restart action exited 0 warming up up to 100s"}
    finally:
        for s in servers:
            s.stop()
        sim.stop()


def test_no_agent_listener_without_agent_listen(w: World) -> None:
    assert w.client.application.extensions["remediator"].agent is None


# -- silences against a real Alertmanager ------------------------------------------------------------------
@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    if AM_BINARY is None:
        pytest.skip("prometheus-alertmanager not installed")
    port, cluster = free_port(), free_port()
    cfg = tmp_path / "am.yml"
    cfg.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
    proc = ManagedProcess([AM_BINARY, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am-data'}",
                           f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cluster}"],
                          name="alertmanager", log_dir=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/-/ready", timeout=20)
        yield url
    finally:
        proc.stop()


def test_silence_covers_the_restart_and_is_removed_after(tmp_path: Path, alertmanager: str) -> None:
    w = build(tmp_path, alertmanager_url=alertmanager)
    w.post(payload(alert()))
    w.run()
    rows = w.store.conn().execute("SELECT * FROM silences").fetchall()
    assert len(rows) == 1 and rows[0]["backend"] == "gpu-a" and rows[0]["expired_at"] is None
    sil = requests.get(f"{alertmanager}/api/v2/silence/{rows[0]['id']}", timeout=5).json()
    assert sil["status"]["state"] == "active"
    assert sil["matchers"] == [{"name": "backend", "value": "gpu-a", "isRegex": False, "isEqual": True}]
    length = (datetime.fromisoformat(sil["endsAt"]) - datetime.fromisoformat(sil["startsAt"])).total_seconds()
    assert abs(length - (60 + 30 + 100 + 60)) < 2           # drain + action + warm-up timeouts + margin
    w.ready["gpu-a"] = False
    w.clock.advance(5)
    w.run()
    assert requests.get(f"{alertmanager}/api/v2/silence/{rows[0]['id']}", timeout=5).json()["status"]["state"] == \
        "active"
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.state() == "ready"
    assert requests.get(f"{alertmanager}/api/v2/silence/{rows[0]['id']}", timeout=5).json()["status"]["state"] == \
        "expired"
    assert w.store.conn().execute("SELECT expired_at FROM silences").fetchone()[0] is not None
    kinds = w.kinds()
    assert kinds.index("draining") < kinds.index("silence_created") < kinds.index("restarting")
    assert kinds.index("silence_expired") < kinds.index("recovered")
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, 'llm_health_remediator_silences_total{result="created"} 1')
    assert has_sample(metrics, 'llm_health_remediator_silences_total{result="expired"} 1')


def test_unreachable_alertmanager_is_recorded_and_never_blocks_the_restart(tmp_path: Path) -> None:
    w = build(tmp_path, alertmanager_url=f"http://127.0.0.1:{free_port()}")
    restart_cycle(w)
    assert w.calls == ["gpu-a"]
    failed = w.store.events(kind="silence_failed")
    assert len(failed) == 1 and "restart goes on" in failed[0].reason
    assert w.store.conn().execute("SELECT count(*) FROM silences").fetchone()[0] == 0


def test_a_lifecycle_check_that_raises_never_starves_the_other_backends(w: World) -> None:
    """Backends outside a restart are looked at oldest first; a check raising for the first one ended
    the pass before the others (and it stayed first in line): they were never marked READY."""
    w.store.conn().execute("UPDATE lifecycle SET state = 'initializing', incident_id = NULL")
    answers = w.authority.io.answer_check

    def check(b: Any) -> tuple[bool, str]:
        if b.name == "gpu-a":
            raise RuntimeError("odd answer")
        return answers(b)

    w.authority.io.answer_check = check
    for _ in range(3):
        w.clock.advance(10)                         # past warmup_poll: both due
        one_pass(w.authority)
    assert w.state("gpu-b") == "ready"
    assert w.state("gpu-a") == "initializing"
