"""A small in-process model server with a fixed number of slots, for load tests behind a real HAProxy.

A completion whose JSON body has `"hold": "<tag>"` is a long generation: like an engine the server runs at
most `slots` of them and keeps the rest waiting in its own queue, and each keeps its slot until
`release(tag)` (or `release()`). Any other completion is answered at once (it needs no slot: a probe that
shows where HAProxy sent a request), `{"model": <name>}`. GET /health and GET /v1/models answer 200.
Counters are read in-process (`running`, `waiting`, `in_flight` = held requests here, `max_in_flight`).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import ThreadingHTTPServer
from typing import Any

from llm_health.drill.procs import free_port
from llm_health.httpserver import QuietHandler


class SlotServer:
    def __init__(self, name: str, slots: int) -> None:
        self.name = name
        self.slots = slots
        self.port = free_port()
        self._cond = threading.Condition()
        self._running = 0
        self._waiting = 0
        self._held: Counter[str] = Counter()      # tag -> requests with it in flight (running or waiting)
        self._released: set[str] = set()
        self._release_all = False
        self.max_in_flight = 0                     # the most requests this server ever had at once
        self.served = 0
        # HAProxy's health checks close their connection as soon as they have the status line: QuietHandler
        # says nothing of a client gone before its answer
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"slots-{name}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SlotServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- counters ---------------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        with self._cond:
            return self._running

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._waiting

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._running + self._waiting

    def held(self, tag: str) -> int:
        """Requests with `"hold": tag` in flight here (running or waiting for a slot)."""
        with self._cond:
            return self._held[tag]

    def release(self, tag: str | None = None) -> None:
        """Let requests held under `tag` finish, and later ones with it pass at once (None: every tag)."""
        with self._cond:
            if tag is None:
                self._release_all = True
            else:
                self._released.add(tag)
            self._cond.notify_all()

    def reset(self) -> None:
        """Forget released tags and the high-water mark (between tests; nothing may be in flight)."""
        with self._cond:
            self._released.clear()
            self._release_all = False
            self.max_in_flight = self._running + self._waiting

    # -- serving ----------------------------------------------------------------------------------------

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        tag = body.get("hold") if isinstance(body.get("hold"), str) else None
        if tag is None:
            with self._cond:
                self.served += 1
            return {"model": self.name, "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}
        with self._cond:
            self._waiting += 1
            self._held[tag] += 1
            self.max_in_flight = max(self.max_in_flight, self._running + self._waiting)
            self._cond.wait_for(lambda: self._running < self.slots)
            self._waiting -= 1
            self._running += 1
            try:
                self._cond.wait_for(lambda: self._release_all or tag in self._released)
            finally:
                self._held[tag] -= 1
                self._running -= 1
                self.served += 1
                self._cond.notify_all()
        return {"model": self.name, "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}

    def _handler(self) -> type[QuietHandler]:
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/health":
                    self.reply_json(200, {})
                elif self.path == "/v1/models":
                    self.reply_json(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})
                else:
                    self.reply_json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    self.reply_json(404, {"error": {"message": "not found"}})
                    return
                self.reply_json(200, server._complete(body if isinstance(body, dict) else {}))

        return Handler
