"""The sidecar's HTTP side: what the kubelet probes.

* `GET /ready`: 200 `ready: <why>` or 503 `not ready: <why>` (text, one line), from `Watch.decision()`:
  the latest facts, no network call while the probe waits;
* `GET /healthz`: 200 while the sidecar itself runs (it says nothing about the engine or the remediator);
* anything else: 404. HEAD answers the same without a body.
"""

from __future__ import annotations

import socket
import threading
from http.server import ThreadingHTTPServer

from llm_health.httpserver import QuietHandler
from llm_health.remediator.sidecar.watch import Watch


class _Handler(QuietHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/ready":
            d = self.server.watch.decision()
            self.reply(200 if d.ready else 503, f"{'ready' if d.ready else 'not ready'}: {d.reason}\n",
                       "text/plain; charset=utf-8")
        elif path == "/healthz":
            self.reply(200, "ok\n", "text/plain; charset=utf-8")
        else:
            self.reply(404, "not found: /ready, /healthz\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET  # noqa: N815 - http.server's name


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], watch: Watch) -> None:
        self.watch = watch
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)


class ReadinessServer:
    """/ready and /healthz on `host:port` (port 0: a free one, see `.port`)."""

    def __init__(self, host: str, port: int, watch: Watch) -> None:
        self._server = _Server((host, port), watch)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> ReadinessServer:
        self._thread = threading.Thread(target=self.serve_forever, name="readiness-http", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving (from another thread than serve_forever's) and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
