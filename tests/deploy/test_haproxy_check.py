"""Every shipped HAProxy config keeps a busy vLLM in rotation through at least a minute of slow /health.

The incident: `/health` of a busy vLLM has been seen taking 30-40 s; `inter 5s fall 3` without
`timeout check` called such a server DOWN after about 10-15 s. Here each config is parsed (defaults,
then the backend's own settings, then default-server, then the server line) and the tolerance is
computed the way HAProxy schedules checks: checks of one server never overlap, a check without an
answer fails after `timeout check` (or after `inter` when `timeout check` is unset), and `fall`
consecutive failures mark the server DOWN. The first failure can come right after /health turns slow
(the check in flight when it did), so DOWN comes no earlier than (fall - 1) x max(T, interval), where
interval is `fastinter` (HAProxy's interval while a server is failing; default `inter`).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.haproxy import LEAST_LOADED_LUA
from tests.support.paths import REPO

ROOT = REPO
SHIPPED = [
    ROOT / "deploy" / "haproxy" / "haproxy.cfg",
    ROOT / "deploy" / "compose" / "haproxy.cfg",
    ROOT / "deploy" / "compose" / "haproxy-gpu.cfg",
]
SLOW_HEALTH_SECONDS = 60.0   # /health that does not answer for this long must not take a server out
SLOW_ANSWER_SECONDS = 40.0   # /health answering this late (seen under load) must pass the check
HAPROXY_DEFAULTS = {"inter": "2s", "fall": "3", "rise": "2"}  # HAProxy's own defaults
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(text: str) -> float:
    """HAProxy time: a number with an optional unit; no unit means milliseconds."""
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].isdigit():
            return int(text[: -len(unit)]) * _UNITS[unit]
    if text.isdigit():
        return int(text) / 1000
    raise ValueError(f"not an HAProxy time: {text!r}")


@dataclass(frozen=True)
class ServerCheck:
    config: str
    server: str
    inter: float
    fastinter: float
    fall: int
    timeout_check: float | None

    @property
    def check_timeout(self) -> float:
        """How long one check may wait for /health (without `timeout check`: `inter`)."""
        return self.timeout_check if self.timeout_check is not None else self.inter

    @property
    def slow_health_tolerance(self) -> float:
        return (self.fall - 1) * max(self.check_timeout, self.fastinter)


def sections(text: str) -> list[tuple[str, list[list[str]]]]:
    out: list[tuple[str, list[list[str]]]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        if not raw[0].isspace():
            out.append((line.strip(), []))
        elif out:
            out[-1][1].append(line.split())
    return out


def server_options(words: list[str]) -> dict[str, str]:
    """Keyword -> value for the check keywords we read (inter, fastinter, fall) on a server line."""
    options: dict[str, str] = {}
    for i, word in enumerate(words[:-1]):
        if word in ("inter", "fastinter", "fall"):
            options[word] = words[i + 1]
    return options


def checked_servers(name: str, text: str) -> list[ServerCheck]:
    """Every `server ... check` of every backend/listen section, with its effective check settings."""
    defaults_timeout: float | None = None
    found: list[ServerCheck] = []
    for header, lines in sections(text):
        kind = header.split()[0]
        if kind == "defaults":
            for words in lines:
                if words[:2] == ["timeout", "check"]:
                    defaults_timeout = seconds(words[2])
            continue
        if kind not in ("backend", "listen"):
            continue
        timeout_check = defaults_timeout
        default_server: dict[str, str] = dict(HAPROXY_DEFAULTS)
        servers: list[list[str]] = []
        for words in lines:
            if words[:2] == ["timeout", "check"]:
                timeout_check = seconds(words[2])
            elif words[0] == "default-server":
                default_server.update(server_options(words))
            elif words[0] == "server" and "check" in words:
                servers.append(words)
        for words in servers:
            options = {**default_server, **server_options(words)}
            inter = seconds(options["inter"])
            found.append(ServerCheck(
                config=name, server=words[1], inter=inter,
                fastinter=seconds(options["fastinter"]) if "fastinter" in options else inter,
                fall=int(options["fall"]), timeout_check=timeout_check,
            ))
    return found


def test_the_calculation_flags_the_old_setting() -> None:
    """The settings of the incident (inter 5s fall 3, no timeout check) give 10 s: far below a minute."""
    old = """
defaults
    mode http
backend vllm
    option httpchk GET /health
    default-server inter 5s fall 3 rise 2
    server a 10.0.0.5:8000 check
"""
    (check,) = checked_servers("old", old)
    assert check.check_timeout == 5 and check.slow_health_tolerance == 10
    assert check.slow_health_tolerance < SLOW_HEALTH_SECONDS
    # a server-line override wins over default-server; timeout check from defaults applies
    (check,) = checked_servers("override", old.replace("mode http", "timeout check 20s").replace(
        "check\n", "check fall 5 fastinter 1s\n"))
    assert (check.fall, check.fastinter, check.timeout_check, check.slow_health_tolerance) == (5, 1, 20, 80)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_survives_a_minute_of_slow_health(path: Path) -> None:
    checks = checked_servers(path.name, path.read_text())
    assert checks, f"{path}: no server with a health check found"
    for check in checks:
        assert check.timeout_check is not None, f"{path} {check.server}: no `timeout check`"
        assert check.check_timeout > SLOW_ANSWER_SECONDS, (
            f"{path} {check.server}: a /health answering in {SLOW_ANSWER_SECONDS:g}s fails the check "
            f"(timeout {check.check_timeout:g}s)")
        assert check.slow_health_tolerance >= SLOW_HEALTH_SECONDS, (
            f"{path} {check.server}: DOWN after {check.slow_health_tolerance:g}s of slow /health")


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_passes_haproxy_check(path: Path, tmp_path: Path) -> None:
    """Checked beside least_loaded.lua, which each config loads from its own folder (deploy/haproxy/ has it;
    docker-compose.yml mounts it next to the compose configs, tests/deploy/test_compose.py)."""
    shutil.copyfile(path, tmp_path / "haproxy.cfg")
    shutil.copyfile(LEAST_LOADED_LUA, tmp_path / LEAST_LOADED_LUA.name)
    result = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
