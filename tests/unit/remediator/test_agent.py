"""The remediator's HAProxy agent (remediator/agent.py): answers from SQLite (every process the same),
KV usage from the backend's own /metrics, and no listener unless agent_listen is set.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import AgentCheckServer
from llm_health.remediator.store import SqliteStore
from llm_health.simulator.server import SimConfig, Simulator

from llm_health.config import parse_config
from llm_health.drill.procs import free_port, wait_until
from tests.support.alerts import alert, payload
from tests.support.remediator import World, fleet


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
            servers.append(AgentCheckServer("127.0.0.1", 0, AgentAnswers(SqliteStore(w.store.path), config).status_for)
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
