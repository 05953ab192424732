"""`--log-format text|logfmt|json` on the exporter and the remediator, real processes on loopback.

Every line a structured run writes parses (json.loads, a strict logfmt reader), credentials in URLs are
redacted in every format (a backend URL and a discovery URL with user:password, a request URL carrying
one), and a scrape of /metrics or a /healthz probe leaves no access line while other requests do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from tests.support import logfmt

SECRET = "hunter2-s3cret"
FORMATS = ("text", "logfmt", "json")


def with_secret(port: int, path: str = "") -> str:
    return f"http://admin:{SECRET}@127.0.0.1:{port}{path}"


def records(text: str, fmt: str) -> list[dict[str, Any]]:
    """Every line of a structured log, parsed (a line that does not parse fails the test)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if fmt == "json":
        return [json.loads(line) for line in lines]
    return [logfmt.parse(line) for line in lines]


def messages(text: str, fmt: str) -> list[str]:
    return text.splitlines() if fmt == "text" else [str(r.get("msg", "")) for r in records(text, fmt)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_exporter_log_format(launch: Callable[..., ManagedProcess], fmt: str) -> None:
    port = free_port()
    proc = launch(llm_health("exporter", "--listen", f"127.0.0.1:{port}", "--interval", 0.3, "--read-timeout", 0.5,
                             "--backend", f"gpu-a={with_secret(free_port())}", "--log-format", fmt), "exporter")
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health")
    for _ in range(3):
        assert requests.get(base + "/metrics", timeout=5).status_code == 200
    text = wait_until(lambda: (t := proc.log()) and "-> down" in t and t, timeout=30,
                      what="a verdict change in the log")
    assert SECRET not in text, text[-3000:]
    shown = messages(text, fmt)
    start = [m for m in shown if "llm-health exporter:" in m]
    assert start and "listening on" in start[0], shown
    down = [m for m in shown if "gpu-a" in m and "-> down" in m]
    assert down, shown
    if fmt != "text":
        assert all(r["level"] in ("debug", "info", "warning", "error") and r["time"].endswith("Z")
                   for r in records(text, fmt))
    assert not [m for m in shown if "GET /metrics" in m]


def remediator_config(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("t0ken\n")
    os.chmod(tmp_path / "token", 0o600)
    config = tmp_path / "llm-health.yml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "gpu-a", "url": with_secret(free_port()), "restart": ["true"]}],
        "discovery": {"prometheus_url": with_secret(free_port()), "refresh": 0.5},
        "remediator": {"state": "state.db", "token_file": "token", "poll_interval": 0.2},
    }))
    return config


@pytest.mark.parametrize("fmt", FORMATS)
def test_remediator_log_format_and_no_scrape_access_lines(tmp_path: Path, fmt: str) -> None:
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", remediator_config(tmp_path), "--listen",
                                     f"127.0.0.1:{port}", "--workers", 1, "--log-format", fmt),
                          name="remediator", log_dir=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(base + "/healthz", timeout=30)
        for _ in range(3):
            assert requests.get(base + "/metrics", timeout=5).status_code == 200
            requests.get(base + "/healthz", timeout=5)
        # requests that are logged: the status page (with a credential in its query) and a refused webhook
        assert requests.get(base + "/?next=" + with_secret(1), timeout=5).status_code == 200   # sent as it is
        assert requests.post(base + "/webhook", json={}, timeout=5).status_code == 401
        text = wait_until(lambda: (t := proc.log()) and "discovery from" in t and "POST /webhook" in t and t,
                          timeout=30, what="a discovery failure and the webhook's access line in the log")
    finally:
        proc.stop()
    text = proc.log()
    assert SECRET not in text, text[-3000:]
    shown = messages(text, fmt)
    access = [m for m in shown if '"GET ' in m or '"POST ' in m]
    assert any('"POST /webhook' in m and " 401 " in m for m in access), access
    status_page = [m for m in access if '"GET /?next=' in m]
    assert status_page and "***@127.0.0.1" in status_page[0], access
    assert not [m for m in access if "/metrics" in m or "/healthz" in m], access      # scrapes and probes: quiet
    assert any("Booting worker" in m for m in shown), shown                            # gunicorn's own lines too
    assert any("discovery from http://***@127.0.0.1:" in m for m in shown)
    if fmt != "text":
        rows = records(text, fmt)
        webhook = next(r for r in rows if r.get("path") == "/webhook")
        assert webhook["logger"] == "gunicorn.access" and str(webhook["status"]) == "401"
        assert webhook["method"] == "POST" and "pid" in webhook


def test_remediator_debug_level_logs_scrapes(tmp_path: Path) -> None:
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", remediator_config(tmp_path), "--listen",
                                     f"127.0.0.1:{port}", "--workers", 1, "--log-format", "json",
                                     "--log-level", "debug"), name="remediator", log_dir=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(base + "/healthz", timeout=30)
        requests.get(base + "/metrics", timeout=5)
        wait_until(lambda: any(r.get("path") == "/metrics" for r in records(proc.log(), "json")), timeout=15,
                   what="the scrape's access line at debug level")
    finally:
        proc.stop()


def test_a_bad_log_format_is_refused_with_the_choices(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(llm_health("exporter", "--backend", "a=http://127.0.0.1:1", "--log-format", "yaml"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "text, logfmt, json" in done.stderr, done.stderr
