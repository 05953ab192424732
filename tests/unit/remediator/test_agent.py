"""The remediator's HAProxy agent (remediator/agent.py): answers from SQLite (every process the same),
KV usage from the backend's own /metrics, and no listener unless agent_listen is set. A server is taken
out only on a verified outcome, never in dry run and never below min_ready.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from llm_health.config import parse_config
from llm_health.drill.procs import free_port, wait_until
from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import AgentCheckServer, agent_reply
from llm_health.simulator.server import SimConfig, Simulator
from tests.support import stores
from tests.support.alerts import alert, payload
from tests.support.remediator import World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = fleet(tmp_path)
    yield world
    world.close()


def ask(port: int, name: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(name.encode() + b"\n")
        return s.makefile().readline().strip()


def test_agent_answers_from_sqlite_with_kv_from_the_backend(tmp_path: Path) -> None:
    sim = Simulator(SimConfig(port=free_port(), model="gpu-a")).start()
    servers: list[AgentCheckServer] = []
    try:
        wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator")
        w = fleet(tmp_path)
        config = parse_config({"backends": [{"name": "gpu-a", "url": sim.url}, {"name": "gpu-b",
                               "url": "http://127.0.0.1:18101"}], "remediator": {"state": w.store.path}})
        for _ in range(2):   # two processes' worth of agents, each with its own store handle
            servers.append(AgentCheckServer("127.0.0.1", 0, AgentAnswers(stores.reopen(w.store), config).status_for)
                           .start())
        answers = lambda name: {ask(s.port, name) for s in servers}  # noqa: E731
        assert answers("gpu-a") == {"ready up 100%"}           # KV 0 from the simulator's own /metrics
        assert answers("nope") == {"down #unknown backend"}
        w.deliver(payload(alert("gpu-a")))
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


def answer(w: World, name: str) -> str:
    return agent_reply(AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2).status_for(name))


def test_alerts_for_every_backend_without_verification_take_no_server_out(tmp_path: Path) -> None:
    """Prometheus loses sight of every vLLM: LLMBackendDown fires for all; verification cannot tell."""
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"))
    w.outcomes.update(dict.fromkeys(w.outcomes, "unknown"))
    w.deliver(payload(*(alert(n, alertname="LLMBackendDown") for n in ("gpu-a", "gpu-b", "gpu-c"))))
    assert {answer(w, n) for n in ("gpu-a", "gpu-b", "gpu-c")} == {"ready up 100%"}   # before any look
    w.run()
    assert {w.last_incident(n)["verified_outcome"] for n in ("gpu-a", "gpu-b", "gpu-c")} == {"unknown"}
    assert {answer(w, n) for n in ("gpu-a", "gpu-b", "gpu-c")} == {"ready up 100%"}
    assert w.restarted == []


def test_verified_unresponsive_takes_a_server_out_but_never_below_min_ready(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), min_ready=1, unresponsive_after=1000)
    w.outcomes.update(dict.fromkeys(w.outcomes, "unresponsive"))
    w.deliver(payload(alert("gpu-a"), alert("gpu-b")))
    w.run()
    assert answer(w, "gpu-a") == "down #verified unresponsive incident 1"
    assert answer(w, "gpu-b") == "down #verified unresponsive incident 2"
    assert answer(w, "gpu-c") == "ready up 100%"
    w.deliver(payload(alert("gpu-c")))
    w.run()
    # every backend verified unresponsive: taking any out would leave none READY and up
    agent = AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2)
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        status = agent.status_for(n)
        assert status is not None and agent_reply(status) == "ready up 100%"
        assert "verified unresponsive" in status.reason and "min_ready 1" in status.reason
    assert w.restarted == [] and {w.state(n) for n in ("gpu-a", "gpu-b", "gpu-c")} == {"ready"}


def test_dry_run_never_changes_the_load_balancer(tmp_path: Path) -> None:
    w = fleet(tmp_path, dry_run=True)
    w.outcomes["gpu-a"] = "down"
    w.deliver(payload(alert()))
    w.run()
    assert w.last_incident()["state"] == "observed" and w.last_incident()["verified_outcome"] == "down"
    assert answer(w, "gpu-a") == "ready up 100%" and w.restarted == []
