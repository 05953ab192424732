"""The counting proxy of the real-engine tests, run as a process of its own:
`python -m tests.support.counting_proxy UPSTREAM PORT`.

It forwards every request to UPSTREAM and keeps what the tests ask about: every generation request,
the probes among them (`X-LLM-Health-Probe: 1`) with the monotonic time each arrived, every GET
/metrics it forwarded (started, seconds, status), the last 64 pages answered 200, and per probe the
pages answered in the `LOOKBACK` seconds before it (what the prober had read). The tests read that
state from `/__counting_proxy__/...` (`tests.support.real_engines.CountingProxy` is the client).

Why a process and not a thread of the test: the exporter reads the engine through this proxy, so a
proxy inside the test process stops answering whenever the test process is not scheduled (CI once
showed a test process with no thread running for 17 s). The exporter then rightly sees a server that
answers nothing while work is in flight and calls it stalled: a false finding about the engine made
by the harness. In a process of its own the proxy answers while the test process waits.
CLOCK_MONOTONIC is one clock for every process of the machine, so the test compares the probe times
with its own (when its load was in flight).
"""

from __future__ import annotations

import http.client
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from llm_health.httpserver import QuietHandler

CONTROL = "/__counting_proxy__/"
LOOKBACK = 1.5          # seconds of pages kept per probe
PROBE_PAGES_KEPT = 256  # the probes whose pages are kept (the latest ones)
HOP_HEADERS = ("content-length", "connection", "transfer-encoding", "date", "server")  # set by the proxy


class Counts:
    """What the proxy saw; every field guarded by `lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.generation = 0
        self.probe_times: list[float] = []
        self.pages: list[tuple[float, float, int]] = []   # each GET /metrics: (started, seconds, status)
        self.bodies: deque[tuple[float, str]] = deque(maxlen=64)  # the last pages answered 200: (at, text)
        self.probe_pages: dict[int, list[str]] = {}        # probe index -> pages read in LOOKBACK before it

    def probe(self) -> None:
        with self.lock:
            now = time.monotonic()
            index = len(self.probe_times)
            self.probe_times.append(now)
            self.probe_pages[index] = [text for at, text in self.bodies if now - at <= LOOKBACK]
            self.probe_pages.pop(index - PROBE_PAGES_KEPT, None)

    def page(self, started: float, status: int, body: bytes) -> None:
        with self.lock:
            now = time.monotonic()
            self.pages.append((started, now - started, status))
            if status == 200:
                self.bodies.append((now, body.decode(errors="replace")))

    def control(self, path: str) -> Any:
        """The answer to GET /__counting_proxy__/<what>: `state`, `bodies` or `probe-pages/<index>`."""
        what = path.removeprefix(CONTROL)
        with self.lock:
            if what == "state":
                return {"generation": self.generation, "probe_times": self.probe_times, "pages": self.pages}
            if what == "bodies":
                return list(self.bodies)
            if what.startswith("probe-pages/"):
                return self.probe_pages.get(int(what.rsplit("/", 1)[1]))
        raise KeyError(what)


def handler(upstream: str, counts: Counts) -> type[BaseHTTPRequestHandler]:
    host, port = upstream.removeprefix("http://").split(":")

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def _control(self) -> None:
            try:
                self.reply_json(200, counts.control(self.path))
            except (KeyError, ValueError) as exc:
                self.reply_json(404, {"error": str(exc)})

        def _forward(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if method == "POST" and "completions" in self.path:
                with counts.lock:
                    counts.generation += 1
                if self.headers.get("X-LLM-Health-Probe") == "1":
                    counts.probe()
            conn = http.client.HTTPConnection(host, int(port), timeout=300)
            started, status, data, out_headers = time.monotonic(), 0, b"", []
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                conn.request(method, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                status, out_headers = resp.status, resp.getheaders()
            except (OSError, http.client.HTTPException):
                # refused or broken upstream: the client sees its connection drop
                self.close_connection = True
                self.connection.close()
                return
            finally:
                conn.close()
                if method == "GET" and self.path.startswith("/metrics"):
                    counts.page(started, status, data)
            try:
                self.send_response(status)
                for k, v in out_headers:
                    if k.lower() not in HOP_HEADERS:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client gave up (its timeout): nothing to answer

        def do_GET(self) -> None:  # noqa: N802
            if self.path.startswith(CONTROL):
                self._control()
            else:
                self._forward("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._forward("POST")

    return Handler


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.support.counting_proxy UPSTREAM PORT", file=sys.stderr)
        return 2
    httpd = ThreadingHTTPServer(("127.0.0.1", int(argv[1])), handler(argv[0], Counts()))
    httpd.daemon_threads = True
    httpd.serve_forever(poll_interval=0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
