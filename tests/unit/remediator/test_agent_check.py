"""remediator.agent_check: the pure reply mapping and the TCP listener on loopback."""

from __future__ import annotations

import socket

import pytest

from llm_health.config import ConfigError
from llm_health.remediator.agent_check import (
    AgentCheckServer,
    AgentStatus,
    agent_reply,
    parse_listen,
    sanitize_reason,
    weight_percent,
)
from llm_health.remediator.lifecycle import LifecycleState

S = LifecycleState


@pytest.mark.parametrize(
    ("kv", "weight"),
    [(None, 100), (float("nan"), 100), (0.0, 100), (0.5, 100), (0.85, 100), (0.925, 55), (0.97, 28),
     (0.99, 16), (1.0, 10), (1.3, 10)],
)
def test_weight_drops_past_085(kv: float | None, weight: int) -> None:
    assert weight_percent(kv) == weight


def test_weight_is_monotonic() -> None:
    ws = [weight_percent(i / 1000) for i in range(0, 1001)]
    assert all(a >= b for a, b in zip(ws, ws[1:], strict=False))


@pytest.mark.parametrize(
    ("status", "reply"),
    [
        (AgentStatus(S.READY, 0.2), "ready up 100%"),
        (AgentStatus(S.READY, 1.0), "ready up 10%"),
        (AgentStatus(S.DRAINING, 0.2, "restart"), "drain"),
        (AgentStatus(S.READY, 0.2, "stalled for 130s", healthy=False), "down #stalled for 130s"),
        (AgentStatus(S.READY, None, "", healthy=False), "down #unhealthy"),
        (AgentStatus(S.INITIALIZING, None, ""), "down #initializing"),
        (AgentStatus(S.STOPPED, None, "restarting"), "down #restarting"),
        (AgentStatus(S.ERROR, None, "warm-up timeout"), "down #warm-up timeout"),
        (None, "down #unknown backend"),
    ],
)
def test_agent_reply(status: AgentStatus | None, reply: str) -> None:
    assert agent_reply(status) == reply


def test_reason_is_sanitised() -> None:
    evil = "boom\nup 100%,ready#x\r\t;$(rm -rf /)`"
    clean = sanitize_reason(evil)
    assert "\n" not in clean and "\r" not in clean and "," not in clean and "#" not in clean
    assert "%" not in clean and "$" not in clean and "`" not in clean
    assert clean.startswith("boom up 100")
    assert sanitize_reason("") == "no reason given"
    assert len(sanitize_reason("x" * 1000)) <= 120
    reply = agent_reply(AgentStatus(S.ERROR, None, evil))
    assert reply.startswith("down #") and "\n" not in reply


def _ask(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        if payload:
            s.sendall(payload)
        else:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(1024):
            data += chunk
    return data


def test_server_answers_per_backend_name() -> None:
    table = {"gpu-a": AgentStatus(S.READY, 0.99), "gpu-b": AgentStatus(S.DRAINING)}

    def broken(name: str) -> AgentStatus | None:
        if name == "broken":
            raise RuntimeError("store unavailable")
        return table.get(name)

    with AgentCheckServer("127.0.0.1", 0, broken) as server:
        port = server.port
        assert _ask(port, b"gpu-a\n") == b"ready up 16%\n"
        assert _ask(port, b"gpu-b\r\n") == b"drain\n"
        assert _ask(port, b"nope\n") == b"down #unknown backend\n"
        assert _ask(port, b"../../etc/passwd\n") == b"down #unknown backend\n"
        assert _ask(port, b"") == b"down #unknown backend\n"
        assert _ask(port, b"broken\n") == b""          # no guess: HAProxy keeps its state
        table["gpu-b"] = AgentStatus(S.READY, 0.1)
        assert _ask(port, b"gpu-b\n") == b"ready up 100%\n"


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9412") == ("127.0.0.1", 9412)
    assert parse_listen("[::1]:9412") == ("::1", 9412)
    for bad in ("9412", "host:", ":1", "h:99999", "h:x"):
        with pytest.raises(ConfigError):
            parse_listen(bad)
