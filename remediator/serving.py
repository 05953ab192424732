"""A gunicorn gthread worker that slow clients cannot starve: requests arrive whole before a thread sees them.

gunicorn's gthread worker gives every accepted connection to a pool thread, which then blocks reading
the request. A client sending its headers (or body) a byte a second holds that thread for as long
as the read lasts; `threads` such clients starve /webhook and /healthz. A per-request timer that cuts
the connection after `request_timeout` (this module's previous design) only bounds how long: 40 slow
clients on 2 x 16 threads kept /healthz waiting 11 s, 100 of them 18 s.

So here no thread waits for a client. The worker's event loop (gthread's selector, which already
watches the listening sockets and the kept-alive connections) also holds every connection whose
request has not fully arrived: it reads what is there without blocking, and `framing.RequestFraming`
says whether the head and the body (up to `max_body_bytes`) are complete. gunicorn's own parser judges
the head there, and parses the whole buffered request again in the pool thread, so all of gunicorn's
request validation stays; the thread never waits on the socket for the request (a socket timeout
of `request_timeout` is the backstop should the two ever disagree; it also bounds each write of the
answer, so a client that does not read its answer holds the thread that long at most). Bounded, per
worker:

* `idle_timeout`: a new connection without a byte for this long is closed (and gunicorn's keep-alive
  timeout between requests is the same setting);
* `request_timeout`: a request must be complete this long after its first byte (each request on a
  kept-alive connection too), else `408` and close;
* `max_header_bytes`: a longer head gets `431`; a body over `max_body_bytes` gets `413` (Content-Length
  or chunked) without being read; every such answer is JSON, `{"error": ...}`, like the app's;
* `max_pending_connections`: while this many requests are incomplete, the worker stops accepting
  (new connections wait in the kernel's backlog, or another worker takes them); loopback too;
* `max_pending_per_peer`: a client address with this many incomplete requests gets `503` for more.

Normal clients see no difference: keep-alive, pipelining, chunked bodies and `Expect: 100-continue`
(answered here, once, when the head is complete) behave as with gunicorn alone. What a slow client
costs is a file descriptor and its buffered bytes (at most max_header_bytes + max_body_bytes +
192 KiB of read-ahead and chunk framing), never a thread. Connections are closed without blocking the
loop (gunicorn's graceful close lingers up to 2 s in the loop itself; here the lingering is one more
watched socket). Plain HTTP/1.x only: the server refuses TLS, HTTP/2 and the PROXY protocol with this
worker (the remediator sets none). It subclasses gthread's internals, hence gunicorn 27.x in pyproject.

Why not another design: a timer per request (the previous one) bounds how long a thread is held, not
how many; more threads only raise the number of slow clients needed; an async worker (gevent, ASGI)
would change the whole server for one guarantee; a buffering proxy in front is the right tool on an
exposed network (docs/install.md) but must not be required for the remediator to stay responsive.
"""

from __future__ import annotations

import io
import resource
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from gunicorn.http.body import Body
from gunicorn.workers.gthread import ThreadWorker

from llm_health.remediator.buffering import Buffering, GuardedConn, Pending, ServingLimits, Throttled, peer_of
from llm_health.remediator.lingering import LINGER_MAX

STOP_GRACE = 2.0            # at a graceful stop, a request being read (or not begun) has this long to arrive
CONNECTIONS_BEYOND_PENDING = 256   # worker_connections = max_pending_connections + this
YIELD_FOR = 0.02            # the authority's worker leaves a new connection this long to the other workers
TAKING_FOR = 2 * YIELD_FOR  # ... and when they did not take it, takes what waits (a stale "waits" lasts this long)


class GuardedThreadWorker(Buffering, ThreadWorker):  # type: ignore[misc]
    """gthread's worker with the request reading of buffering.py and the closing of lingering.py."""

    limits: ServingLimits = ServingLimits()   # set by the server before the workers fork
    leads: Callable[[], bool] = staticmethod(lambda: False)   # this worker holds the authority (cli.start_services)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: dict[GuardedConn, Pending] = {}
        self.per_peer: dict[str, int] = {}
        self.lingering: dict[socket.socket, float] = {}
        self.next_sweep = float("inf")
        self.accept_paused_until = 0.0
        self.yielding = False               # accept paused to leave new connections to the other workers
        self.taking_until = 0.0             # ... the others did not take them: this worker takes what waits
        self.stopping_at: float | None = None
        self.throttled = Throttled(self.log)

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        super().check_config(cfg, log)
        if cfg.is_ssl or getattr(cfg, "proxy_protocol", "off") not in ("off", False, None) or \
                getattr(cfg, "http2_cleartext", "off") != "off" or "h2" in str(getattr(cfg, "http_protocols", "h1")):
            raise RuntimeError("GuardedThreadWorker serves plain HTTP/1.x only (no TLS, HTTP/2, PROXY protocol)")

    def init_process(self) -> None:
        need = self.cfg.worker_connections + LINGER_MAX + 128
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < need:
            target = need if hard == resource.RLIM_INFINITY else min(need, hard)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                target = soft
            if target < need:
                self.log.warning("open files limited to %d (RLIMIT_NOFILE), %d wanted for %d connections: "
                                 "lower remediator.max_pending_connections or raise the limit", target, need,
                                 self.cfg.worker_connections)
        super().init_process()

    def enqueue_req(self, conn: Any) -> None:
        """gunicorn's way to a thread (a kept-alive connection readable again, or read-ahead of a pipelined
        request after a response): read the request first."""
        self.read(conn)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        now = time.monotonic()
        super().wait_for_and_dispatch_events(max(0.0, min(timeout, self.next_sweep - now)))
        now = time.monotonic()
        if not self.alive:                  # stopping: every connection being read gets 2 s at most
            if self.stopping_at is None:
                self.stopping_at = now
            # also one without a byte yet: accepted a moment before the stop (a reload, a scale-down), its request
            # is on its way; closed at once it would be reset under the client (gunicorn's gthread lingers on
            # kept-alive connections likewise, STOP_KEEPALIVE_LINGER)
            for r in self.reading.values():
                r.deadline = min(r.deadline, self.stopping_at + STOP_GRACE)
                self.next_sweep = min(self.next_sweep, r.deadline)
        if now >= self.next_sweep:
            self.sweep(now)

    def set_accept_enabled(self, enabled: bool) -> None:
        if enabled and (len(self.reading) >= self.limits.max_pending_connections
                        or time.monotonic() < self.accept_paused_until):
            enabled = False
        if enabled and self.yielding:      # back from leaving connections to the others: did they take them?
            self.yielding = False
            self.take_what_waits()
        super().set_accept_enabled(enabled)

    def accept(self, listener: Any) -> None:
        """The worker that holds the authority leaves new connections to the other workers for YIELD_FOR
        seconds: its threads verify, claim and restart, and a storm's webhooks served there queued behind
        them (the storm benchmark: p99 127 ms for the webhooks it served, 33 ms in the other three workers).
        The connections still waiting after that (the others are stopped, busy or paused by slow clients) it
        takes, all of them; the next arrival is left to the others again. A kept-alive connection it serves
        is closed after its answer (handle_request), so its client reconnects to the others (Alertmanager
        keeps its connections, also those made before this worker took the lease). A worker alone accepts
        at once and keeps its connections alive."""
        now = time.monotonic()
        if self.yields() and now >= self.taking_until:
            self.yielding = True
            self.accept_paused_until = now + YIELD_FOR
            self.next_sweep = min(self.next_sweep, self.accept_paused_until)
            super().set_accept_enabled(False)
            return
        super().accept(listener)
        if self.taking_until:         # more waiting: go on taking (a stale answer lasts TAKING_FOR at most)
            self.take_what_waits()

    def yields(self) -> bool:
        """This worker holds the authority and there are other workers to serve (accept, handle_request)."""
        return self.cfg.workers > 1 and self.leads()

    def take_what_waits(self) -> None:
        """Take connections for TAKING_FOR more seconds while one waits on a listening socket (not taken by
        any worker yet); else leave the next arrival to the others again."""
        waiting = bool(select.select(self.sockets, [], [], 0)[0])       # one poll of every listener
        self.taking_until = time.monotonic() + TAKING_FOR if waiting else 0.0

    def handle_request(self, req: Any, conn: Any) -> Any:
        """gunicorn's, with the body taken from the buffer first; the socket keeps its timeout, so writing
        the answer to a client that does not read it holds this thread at most request_timeout per write."""
        if getattr(conn, "continued", False):
            req._expected_100_continue = False    # sent already, when the head was complete
            conn.continued = False
        peer = peer_of(conn.client)
        if self.yields():     # a kept-alive client (Alertmanager keeps its connections) reconnects elsewhere
            req.must_close = True
        try:
            data = req.body.read()                # from the buffer: the request arrived whole
        except TimeoutError:
            self.log.error("request from %s: gunicorn wanted more body than was buffered (closed)", peer)
            return False
        req.body = Body(io.BytesIO(data))
        try:
            return super().handle_request(req, conn)
        except TimeoutError:
            self.throttled.note("write", f"closed the connection of {peer}: it did not take the answer within "
                                f"{self.limits.request_timeout:g} s (remediator.request_timeout)", time.monotonic())
            return False
