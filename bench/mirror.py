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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.world import PROBE, World

MODEL = "sim-model"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; version=0.0.4") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        world: World = self.server.world
        if not world.up:
            self._send(503, b"reloading")
        elif self.path == "/metrics":
            self._send(200, (world.page() or "").encode())
        elif self.path == "/health":
            self._send(200, b"")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": MODEL}]}).encode(), "application/json")
        else:
            self._send(404, b"not found")

    def do_POST(self) -> None:  # noqa: N802
        world: World = self.server.world
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions" or not world.up:
            self._send(503 if not world.up else 404, b"")
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
            self._send(200, json.dumps(answer).encode(), "application/json")
        else:
            self._send(504, json.dumps({"error": result.get("outcome", "no answer")}).encode(), "application/json")


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
