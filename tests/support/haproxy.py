"""HAProxy for the tests: the shipped config's backend directives around test servers, and `llm-health sim` backends."""

from __future__ import annotations

from dataclasses import dataclass

import requests

from llm_health.drill.procs import ManagedProcess
from tests.support.paths import REPO

DEPLOY_CFG = REPO / "deploy" / "haproxy" / "haproxy.cfg"


def backend_directives(cfg: str, section: str = "backend vllm") -> list[str]:
    """Lines of a section, without server/default-server lines (those carry addresses and intervals)."""
    lines: list[str] = []
    inside = False
    for raw in cfg.splitlines():
        if raw and not raw[0].isspace():
            inside = raw.strip() == section
            continue
        line = raw.strip()
        if inside and line and not line.startswith("#") and line.split()[0] not in ("server", "default-server"):
            lines.append(line)
    return lines


@dataclass
class Sim:
    name: str
    port: int
    proc: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        return requests.get(self.url + "/sim/stats", timeout=5).json()

    def in_flight(self) -> int:
        stats = self.stats()
        return int(stats["running"]) + int(stats["waiting"])

    def fault(self, fault: str, seconds: float | None = None) -> None:
        body: dict[str, object] = {"fault": fault}
        if seconds is not None:
            body["seconds"] = seconds
        requests.post(self.url + "/sim/fault", json=body, timeout=5).raise_for_status()


def render_config(fe_port: int, socket_path: str, agent_port: int, backends: dict[str, Sim]) -> str:
    directives = "\n    ".join(backend_directives(DEPLOY_CFG.read_text()))
    servers = "\n    ".join(
        f'server {name} 127.0.0.1:{b.port} check agent-check agent-addr 127.0.0.1 agent-port {agent_port} '
        f'agent-send "{name}\\n"'
        for name, b in backends.items()
    )
    return f"""\
global
    maxconn 256
    stats socket {socket_path} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend llm
    bind 127.0.0.1:{fe_port}
    default_backend vllm
backend vllm
    {directives}
    default-server inter 200ms fall 1 rise 1 weight 100 agent-inter 200ms
    {servers}
"""
