"""The app factory wires and runs nothing: no thread, no listener, no query; the server starts the services."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from llm_health.config import parse_config
from llm_health.drill.procs import free_port, wait_until
from tests.support.loopback import Loopback


class Targets(BaseHTTPRequestHandler):
    """A Prometheus that knows no targets, counting the queries it answers."""

    queries = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        Targets.queries += 1
        body = json.dumps({"status": "success", "data": {"activeTargets": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_create_app_starts_nothing_and_the_services_start_when_asked(tmp_path: Path) -> None:
    from llm_health.remediator.app import create_app

    prometheus = Loopback(Targets)
    agent_port = free_port()
    (tmp_path / "token").write_text("t0ken\n")
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": "http://127.0.0.1:9", "restart": ["true"]}],
        "discovery": {"prometheus_url": prometheus.url, "selector": 'job="vllm"', "refresh": 3600},
        "remediator": {"state": "state.db", "token_file": "token", "agent_listen": f"127.0.0.1:{agent_port}"},
    }, source=str(tmp_path / "llm-health.yml"))
    Targets.queries = 0
    before = set(threading.enumerate())      # threads of earlier tests may end meanwhile: only new ones count
    app = create_app(config)
    services = app.extensions["remediator"].services
    try:
        started = set(threading.enumerate()) - before
        assert not started, [t.name for t in started]
        assert port_is_free(agent_port), "create_app opened the agent-check listener"
        assert Targets.queries == 0, "create_app queried Prometheus"
        assert app.test_client().get("/api/backends").status_code == 200       # it serves all the same
        services.start()
        names = {t.name for t in threading.enumerate()}
        assert {"discovery", "remediator-lease", "remediator-resync", "remediator-retention"} <= names, names
        assert Targets.queries >= 1                                          # the first refresh, at start
        wait_until(lambda: not port_is_free(agent_port), timeout=10, what="the agent listener")
    finally:
        services.stop()
        app.extensions["remediator"].store.close()
        prometheus.stop()
