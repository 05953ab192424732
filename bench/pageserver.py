"""A small, fast fake-metrics server: one process standing in for many backends.

`python -m bench.pageserver --port P [--port P2 ...] [--variants K] [--simple] [--record] [--moving]`

* `GET /b/<i>/metrics`: the k-th request for backend i gets page variant min(k, K-1) of
  `bench.pages.page_variants(K)`: a busy two-engine vLLM v1 page whose counters rise from one
  reading to the next (so verdicts are `busy`, as in production under load); pre-rendered, so
  the server's cost per request is a dict lookup and a socket write;
* `GET /s/<name>/metrics`: a page that never changes (work in flight, counters frozen: stalled),
  until `POST /fix/<name>` (what the storm's restart action calls): then it moves like `/b/`. With
  `--moving` it moves from the start (a serving backend) until `POST /stall/<name>` freezes it;
* `/health`, `/v1/models` under both prefixes: 200;
* `GET /cpu`: this process' CPU seconds (user + sys) and the requests answered so far; `GET /stats`: the
  same and, with `--record`, the monotonic arrival times of each backend's `/metrics` requests
  (CLOCK_MONOTONIC is the machine's, so another process on this machine can compare them with its own).

HTTP/1.1 with keep-alive on an asyncio event loop (one thread, non-blocking sockets): 10 000 kept-alive
connections cost it a socket each, not a thread each, and an answer is one pre-built buffer written to
the transport. Every `--port` is served by the same loop (several host:port endpoints, as a fleet has).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from typing import Any

from bench.pages import page_variants

MODELS = json.dumps({"object": "list", "data": [{"id": "sim-model", "object": "model"}]}).encode()
MAX_HEAD = 65536
REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}


def answer(status: int, body: bytes, ctype: str) -> bytes:
    """A whole HTTP/1.1 answer, headers and body, as one buffer."""
    head = (f"HTTP/1.1 {status} {REASONS[status].decode()}\r\nServer: bench-pageserver\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head + body


NOT_FOUND = answer(404, b"not found", "text/plain")
BAD = answer(400, b"bad request", "text/plain")
HEALTH = answer(200, b"", "application/json")
MODELS_ANSWER = answer(200, MODELS, "application/json")
FIXED = answer(200, b"fixed", "text/plain")


class Pages:
    """What the server answers; the state of every backend (one thread: the event loop's)."""

    def __init__(self, pages: list[str], record: bool, moving: bool = False) -> None:
        self.pages = [answer(200, p.encode(), "text/plain; version=0.0.4; charset=utf-8") for p in pages]
        self.fixed: set[str] = set()
        self.moving = moving                 # /s/ pages move until stalled (POST /stall/<name>)
        self.stalled: set[str] = set()
        self.counts: dict[str, int] = {}
        self.record = record
        self.arrivals: dict[str, list[float]] = {}
        self.requests = 0

    def get(self, path: str) -> bytes:
        parts = path.split("/")   # "", "b", "<i>", "metrics"
        if path in ("/stats", "/cpu"):
            t = os.times()
            doc: dict[str, Any] = {"cpu_s": t.user + t.system, "requests": self.requests}
            if path == "/stats":
                doc["arrivals"] = self.arrivals
            return answer(200, json.dumps(doc).encode(), "application/json")
        if len(parts) < 4 or parts[1] not in ("b", "s"):
            return NOT_FOUND
        rest = "/" + "/".join(parts[3:])
        if rest == "/metrics":
            if self.record:
                self.arrivals.setdefault(parts[2], []).append(time.monotonic())
            if parts[1] == "s" and parts[2] not in self.fixed and (not self.moving or parts[2] in self.stalled):
                return self.pages[0]
            key = parts[1] + parts[2]
            k = self.counts.get(key, 1 if parts[1] == "s" else 0)
            self.counts[key] = k + 1
            return self.pages[min(k, len(self.pages) - 1)]
        if rest == "/health":
            return HEALTH
        if rest == "/v1/models":
            return MODELS_ANSWER
        return NOT_FOUND

    def post(self, path: str) -> bytes:
        parts = path.split("/")   # "", "fix", "<name>"
        if len(parts) == 3 and parts[1] == "fix":
            self.fixed.add(parts[2])
            self.stalled.discard(parts[2])
            return FIXED
        if len(parts) == 3 and parts[1] == "stall":
            self.stalled.add(parts[2])
            self.fixed.discard(parts[2])
            return FIXED
        return NOT_FOUND


class Connection(asyncio.Protocol):
    """One client connection: requests parsed from the bytes as they come, answered in order."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        transport = self.transport
        assert transport is not None
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    transport.write(BAD)
                    transport.close()
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        length = -1
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            request = lines[0].split(" ")
            if len(request) != 3 or length < 0:
                transport.write(BAD)
                transport.close()
                return
            if len(self.buf) < end + 4 + length:
                return                                  # the body is still coming
            self.buf = self.buf[end + 4 + length:]
            method, path, version = request
            self.pages.requests += 1
            if method == "GET":
                out = self.pages.get(path)
            elif method == "POST":
                out = self.pages.post(path)
            else:
                out = NOT_FOUND
            transport.write(out)
            if close or version != "HTTP/1.1":
                transport.close()
                return


def raise_fd_limit() -> None:
    """As many open files as allowed: one socket per kept-alive client connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(ports: list[int], pages: Pages) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(lambda: Connection(pages), "127.0.0.1", port, backlog=4096,
                                        reuse_address=True) for port in ports]
    print(f"serving on 127.0.0.1:{','.join(map(str, ports))}", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pageserver")
    p.add_argument("--port", type=int, action="append", required=True, help="a port to serve (repeatable)")
    p.add_argument("--variants", type=int, default=32)
    p.add_argument("--every", type=float, default=15.0, help="engine seconds between two variants")
    p.add_argument("--simple", action="store_true", help="the simulator's page only (3 histograms)")
    p.add_argument("--record", action="store_true", help="note when each backend's /metrics is asked (/stats)")
    p.add_argument("--moving", action="store_true", help="/s/ pages move until POST /stall/<name> (serving first)")
    args = p.parse_args(argv)
    raise_fd_limit()
    pages = Pages(page_variants(args.variants, full=not args.simple, every=args.every), args.record, args.moving)
    try:
        asyncio.run(serve(args.port, pages))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
