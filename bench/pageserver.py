"""A small, fast fake-metrics server: one process standing in for many backends.

`python -m bench.pageserver --port P [--variants K] [--simple] [--down NAME...]`

* `GET /b/<i>/metrics`: the k-th request for backend i gets page variant min(k, K-1) of
  `bench.pages.page_variants(K)`: a busy two-engine vLLM v1 page whose counters rise from one
  reading to the next (so verdicts are `busy`, as in production under load); pre-rendered, so
  the server's cost per request is a dict lookup and a socket write;
* `GET /s/<name>/metrics`: a page that never changes (work in flight, counters frozen: stalled),
  until `POST /fix/<name>` (what the storm's restart action calls): then it moves like `/b/`;
* `/health`, `/v1/models` under both prefixes: 200.
HTTP/1.1 with keep-alive, one thread per connection (ThreadingHTTPServer).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from bench.pages import page_variants
from llm_health.httpserver import QuietHandler

MODELS = json.dumps({"object": "list", "data": [{"id": "sim-model", "object": "model"}]}).encode()


class Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def do_GET(self) -> None:  # noqa: N802
        parts = self.path.split("/")   # "", "b", "<i>", "metrics"
        if len(parts) < 4 or parts[1] not in ("b", "s"):
            self.reply(404, b"not found", "text/plain")
            return
        rest = "/" + "/".join(parts[3:])
        if rest == "/metrics":
            srv = self.server
            if parts[1] == "s" and parts[2] not in srv.fixed:
                body = srv.pages[0]
            else:
                with srv.lock:
                    key = parts[1] + parts[2]
                    k = srv.counts.get(key, 1 if parts[1] == "s" else 0)
                    srv.counts[key] = k + 1
                body = srv.pages[min(k, len(srv.pages) - 1)]
            self.reply(200, body, "text/plain; version=0.0.4; charset=utf-8")
        elif rest in ("/health", "/v1/models"):
            self.reply(200, MODELS if rest == "/v1/models" else b"", "application/json")
        else:
            self.reply(404, b"not found", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        parts = self.path.split("/")   # "", "fix", "<name>"
        if len(parts) == 3 and parts[1] == "fix":
            with self.server.lock:
                self.server.fixed.add(parts[2])
            self.reply(200, b"fixed", "text/plain")
        else:
            self.reply(404, b"not found", "text/plain")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048     # 1000 backends connect at once at the first cycle


def serve(port: int, variants: int, full: bool, every: float) -> None:
    httpd = Server(("127.0.0.1", port), Handler)
    httpd.pages = [p.encode() for p in page_variants(variants, full=full, every=every)]  # type: ignore[attr-defined]
    httpd.fixed = set()  # type: ignore[attr-defined]
    httpd.counts = {}  # type: ignore[attr-defined]
    httpd.lock = threading.Lock()  # type: ignore[attr-defined]
    print(f"serving on 127.0.0.1:{port}", flush=True)
    httpd.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pageserver")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--variants", type=int, default=32)
    p.add_argument("--every", type=float, default=15.0, help="engine seconds between two variants")
    p.add_argument("--simple", action="store_true", help="the simulator's page only (3 histograms)")
    args = p.parse_args(argv)
    serve(args.port, args.variants, not args.simple, args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
