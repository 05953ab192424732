"""HAProxy for the tests: the shipped config's backend directives around test servers, and `llm-health sim` backends."""

from __future__ import annotations

import re
from dataclasses import dataclass

import requests

from llm_health.drill.procs import ManagedProcess
from tests.support.paths import REPO

DEPLOY_CFG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
LEAST_LOADED_LUA = REPO / "deploy" / "haproxy" / "least_loaded.lua"   # loaded by every shipped config


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


@dataclass(frozen=True)
class Sizing:
    """HAProxy's per-server limits for an engine that runs `slots` requests at once (docs/load-balancing.md)."""

    slots: int

    @property
    def maxconn(self) -> int:
        """A few more than the engine runs: a slot it frees is refilled from its own short queue at once."""
        return self.slots + max(2, self.slots // 8)

    @property
    def maxqueue(self) -> int:
        """Requests waiting in HAProxy per server (and per usable server for those without affinity)."""
        return max(2, self.slots // 4)


def use_server_lines(names: list[str] | tuple[str, ...]) -> list[str]:
    """The backend's `use-server` lines: a request without affinity goes where least_loaded.lua points."""
    return [f"use-server {name} if {{ var(txn.least_loaded) -m str {name} }}" for name in names]


def server_limits(cfg: str, section: str = "backend vllm") -> dict[str, int]:
    """`maxconn`/`maxqueue` of the section's default-server line (those that are set)."""
    inside, limits = False, {}
    for raw in cfg.splitlines():
        if raw and not raw[0].isspace():
            inside = raw.strip() == section
            continue
        words = raw.split("#", 1)[0].split()
        if inside and words[:1] == ["default-server"]:
            for key in ("maxconn", "maxqueue"):
                if key in words:
                    limits[key] = int(words[words.index(key) + 1])
    return limits


def section_setting(cfg: str, section: str, *keywords: str) -> str | None:
    """The value after `keywords` in a section (e.g. "defaults", "timeout", "queue" -> "15s"), None if unset."""
    for line in backend_directives(cfg, section):
        words = line.split()
        if words[: len(keywords)] == list(keywords) and len(words) > len(keywords):
            return words[len(keywords)]
    return None


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


def render_config(fe_port: int, socket_path: str, agent_port: int, backends: dict[str, Sim],
                  slots: int | None = None, timeout_queue: str | None = None) -> str:
    """A test HAProxy: the shipped frontend's routing and backend's directives (hash, bounded load, 503 reply,
    least-loaded path, queue bound, health check) around the test servers, with test intervals and
    addresses; and the shipped vllm-meta backend (requests that generate nothing) over the same servers.

    The per-server limits are the shipped ones, or with `slots` those of the sizing rule for that many
    engine slots - but only the limits the shipped config sets, so an older config without them stays
    without them. `timeout_queue` overrides the shipped `timeout queue`."""
    shipped = DEPLOY_CFG.read_text()
    limits = server_limits(shipped)
    lines = [line for line in backend_directives(shipped) if line.split()[0] != "use-server"]
    if slots is not None:
        size = Sizing(slots)
        limits = {key: getattr(size, key) for key in limits}
        lines = [re.sub(r"\{ avg_queue gt \d+ \}", f"{{ avg_queue gt {size.maxqueue} }}", line) for line in lines]
    if any(line.split()[0] == "http-request" and "lua.least_loaded" in line for line in lines):
        lines += use_server_lines(list(backends))
    directives = "\n    ".join(lines)
    queue = timeout_queue or section_setting(shipped, "defaults", "timeout", "queue")
    redispatch = any(line.split()[:2] == ["option", "redispatch"] for line in backend_directives(shipped, "defaults"))
    limit_words = "".join(f" {key} {value}" for key, value in limits.items())
    servers = "\n    ".join(
        f'server {name} 127.0.0.1:{b.port} check agent-check agent-addr 127.0.0.1 agent-port {agent_port} '
        f'agent-send "{name}\\n"'
        for name, b in backends.items()
    )
    frontend = "\n    ".join(line for line in backend_directives(shipped, "frontend llm") if line.split()[0] != "bind")
    meta = ""
    if "backend vllm-meta" in shipped.splitlines():     # requests that generate nothing: servers tracking vllm's
        meta_lines = [*backend_directives(shipped, "backend vllm-meta"),
                      *(f"server {name} 127.0.0.1:{b.port} track vllm/{name}" for name, b in backends.items())]
        meta = "backend vllm-meta\n    " + "\n    ".join(meta_lines) + "\n"
    return f"""\
global
    maxconn 256
    stats socket {socket_path} mode 600 level admin
    lua-load-per-thread {LEAST_LOADED_LUA}
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
{f"    timeout queue {queue}" if queue else ""}
{"    option redispatch" if redispatch else ""}
frontend llm
    bind 127.0.0.1:{fe_port}
    {frontend}
backend vllm
    {directives}
    default-server inter 200ms fall 1 rise 1 weight 100 agent-inter 200ms{limit_words}
    {servers}
{meta}"""
