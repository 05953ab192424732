"""A loopback HTTP face for a simulated `World`, so the remediator's real re-verify
(`exporter.check.verify`, which speaks HTTP) can look at a server that lives in simulated time.

GET /metrics, /health, /v1/models answer from the world as it is now (503 while it reloads);
POST /v1/completions (the verify probe) is submitted to the world's engine and the world is
advanced in simulated time until it answers or `probe_timeout` passes. Only the replay's main
thread drives the world, and it is blocked inside `verify` while a request is served, so the
world is never touched by two threads at once.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from bench.world import PROBE, World
from llm_health.httpserver import QuietHandler

MODEL = "sim-model"


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def do_GET(self) -> None:  # noqa: N802
        world: World = self.server.world
        if not world.up:
            self.reply(503, b"reloading", "text/plain; version=0.0.4")
        elif self.path == "/metrics":
            self.reply(200, (world.page() or "").encode(), "text/plain; version=0.0.4")
        elif self.path == "/health":
            self.reply(200, b"", "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"data": [{"id": MODEL}]}).encode(), "application/json")
        else:
            self.reply(404, b"not found", "text/plain; version=0.0.4")

    def do_POST(self) -> None:  # noqa: N802
        world: World = self.server.world
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions" or not world.up:
            self.reply(503 if not world.up else 404, b"", "text/plain; version=0.0.4")
            return
        timeout = float(self.server.probe_timeout)
        result: dict[str, str] = {}
        tracked = world.submit(PROBE, 2, int(body.get("max_tokens", 1)), timeout=timeout,
                               on_done=lambda outcome, _t: result.setdefault("outcome", outcome))
        deadline = world.now + timeout
        while tracked is not None and "outcome" not in result and world.now < deadline + 1:
            world.advance_to(world.now + 0.25)
        if result.get("outcome") == "ok":
            answer = {"choices": [{"index": 0, "text": "!", "finish_reason": "length"}]}
            self.reply(200, json.dumps(answer).encode(), "application/json")
        else:
            self.reply(504, json.dumps({"error": result.get("outcome", "no answer")}).encode(), "application/json")


class Mirror:
    def __init__(self, world: World, probe_timeout: float = 10.0) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.world = world  # type: ignore[attr-defined]
        self.httpd.probe_timeout = probe_timeout  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="mirror", daemon=True)

    def __enter__(self) -> Mirror:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
