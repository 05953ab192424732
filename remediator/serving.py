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

import errno
import io
import json
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gunicorn.http.body import Body
from gunicorn.workers.gthread import TConn, ThreadWorker
from llm_health.remediator.framing import Limits, RequestFraming, Step

LINGER_SECONDS = 2.0        # a closed connection's unread input is drained this long at most
LINGER_MAX = 256            # sockets lingering at once; beyond, the oldest is closed outright
STOP_GRACE = 2.0            # at a graceful stop, an incomplete request has this long to arrive
LOG_EVERY = 10.0            # each kind of refusal is logged at most this often (with a count)
CONNECTIONS_BEYOND_PENDING = 256   # worker_connections = max_pending_connections + this


@dataclass(frozen=True)
class ServingLimits:
    request_timeout: float = 10.0
    idle_timeout: float = 5.0
    max_header_bytes: int = 65536
    max_body_bytes: int = 1_048_576
    max_pending_connections: int = 512
    max_pending_per_peer: int = 128

    @property
    def framing(self) -> Limits:
        return Limits(self.max_header_bytes, self.max_body_bytes)


REASONS = {408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
           503: "Service Unavailable"}


def json_answer(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def peer_of(client: Any) -> str:
    return str(client[0]) if isinstance(client, tuple | list) and client else str(client)


class GuardedConn(TConn):  # type: ignore[misc]
    """gunicorn's connection, whose graceful close does not block the event loop, and whose socket has a
    timeout in the pool thread (reads never need it: the request is buffered already)."""

    def __init__(self, worker: GuardedThreadWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker
        self.continued = False     # `100 Continue` was sent for the request being read

    def init(self) -> None:
        super().init()
        self.sock.settimeout(self.worker.limits.request_timeout)

    def close(self, graceful: bool = False) -> None:
        if graceful:
            self.worker.linger(self.sock)
        else:
            super().close()


@dataclass(eq=False)
class Reading:
    """A connection whose request has not fully arrived, watched by the event loop."""

    conn: GuardedConn
    peer: str
    framing: RequestFraming
    deadline: float
    started: bool = False          # a byte of this request has arrived


@dataclass
class _Throttled:
    """Refusals (an attacker's, mostly) logged at most every LOG_EVERY seconds per kind, with a count."""

    log: Any
    last: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)    # the event loop and pool threads note

    def note(self, kind: str, text: str, now: float) -> None:
        with self.lock:
            self.count[kind] = self.count.get(kind, 0) + 1
            if now - self.last.get(kind, -LOG_EVERY) < LOG_EVERY:
                return
            n = self.count.pop(kind)
            self.last[kind] = now
        self.log.warning("%s%s", text, f" ({n} times since the last such line)" if n > 1 else "")


class GuardedThreadWorker(ThreadWorker):  # type: ignore[misc]
    limits: ServingLimits = ServingLimits()   # set by the server before the workers fork

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: dict[GuardedConn, Reading] = {}
        self.per_peer: dict[str, int] = {}
        self.lingering: dict[socket.socket, float] = {}
        self.next_sweep = float("inf")
        self.accept_paused_until = 0.0
        self.stopping_at: float | None = None
        self.throttled = _Throttled(self.log)

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

    # -- connections in: every one is read here until its request is complete ------------------------
    def accept(self, listener: Any) -> None:
        try:
            sock, client = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                now = time.monotonic()
                self.throttled.note("accept", f"cannot accept connections: {exc.strerror}; pausing 0.5 s", now)
                self.accept_paused_until = now + 0.5
                self.next_sweep = min(self.next_sweep, self.accept_paused_until)
                self.set_accept_enabled(False)
                return
            raise
        self.nr_conns += 1
        conn = GuardedConn(self, self.cfg, sock, client, listener.getsockname())
        peer = peer_of(client)
        if self.per_peer.get(peer, 0) >= self.limits.max_pending_per_peer:
            limit = self.limits.max_pending_per_peer
            self.throttled.note("peer", f"refused a connection from {peer}: {limit} of its requests are incomplete "
                                f"(remediator.max_pending_per_peer)", time.monotonic())
            self.refuse(conn, 503, f"too many incomplete requests from {peer} (remediator.max_pending_per_peer "
                                   f"{limit})")
            return
        self.read(conn)
        if len(self.reading) >= self.limits.max_pending_connections:
            self.throttled.note("pending", f"{len(self.reading)} incomplete requests (remediator."
                                "max_pending_connections): not accepting until one completes or times out",
                                time.monotonic())
            self.set_accept_enabled(False)

    def enqueue_req(self, conn: Any) -> None:
        """gunicorn's way to a thread (a kept-alive connection readable again, or read-ahead of a pipelined
        request after a response): read the request first."""
        self.read(conn)

    def read(self, conn: GuardedConn) -> None:
        buffered = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        number = conn.parser.req_count + 1 if conn.parser is not None else 1
        now = time.monotonic()
        framing = RequestFraming(self.cfg, conn.client, self.limits.framing, number)
        r = Reading(conn, peer_of(conn.client), framing, now + self.limits.idle_timeout)
        self.reading[conn] = r
        self.per_peer[r.peer] = self.per_peer.get(r.peer, 0) + 1
        conn.continued = False
        conn.sock.setblocking(False)
        try:
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_readable, r))
        except KeyError:                     # a closed socket's stale entry under the same number
            self.poller.unregister(conn.sock)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_readable, r))
        if buffered:
            self.arrived(r, buffered, now)
        else:
            self.next_sweep = min(self.next_sweep, r.deadline)

    def on_readable(self, r: Reading, sock: socket.socket) -> None:
        if r.conn not in self.reading:
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:                        # the client went away (or reset) before its request was whole
            self.drop(r)
            return
        self.arrived(r, data, time.monotonic())

    def drop(self, r: Reading) -> None:
        self.forget(r)
        self.nr_conns -= 1
        r.conn.close()

    def arrived(self, r: Reading, data: bytes, now: float) -> None:
        try:
            self.judge(r, data, now)
        except Exception:   # noqa: BLE001 - a bug here must cost this connection, not the worker and all others
            self.log.exception("reading a request from %s failed; connection closed", r.peer)
            if r.conn in self.reading:
                self.drop(r)

    def judge(self, r: Reading, data: bytes, now: float) -> None:
        if not r.started:
            r.started = True
            r.deadline = now + self.limits.request_timeout
            self.next_sweep = min(self.next_sweep, r.deadline)
        step = r.framing.feed(data)
        if step is Step.MORE:
            if r.framing.expects_continue and not r.conn.continued:
                r.conn.continued = True
                self.send_now(r.conn.sock, b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        if step in (Step.READY, Step.INVALID):
            self.hand_off(r)
            return
        limits = self.limits
        if step is Step.HEAD_TOO_LARGE:
            status, message = 431, (f"request head too large: more than {limits.max_header_bytes} bytes "
                                    "(remediator.max_header_bytes)")
        elif r.framing.chunks is None:
            status, message = 413, f"body too large: {r.framing.length} bytes > {limits.max_body_bytes}"
        else:
            status, message = 413, f"body too large: more than {limits.max_body_bytes} bytes"
        self.throttled.note(str(status), f"answered {status} to {r.peer}: {message}", now)
        self.forget(r)
        self.refuse(r.conn, status, message)

    def hand_off(self, r: Reading) -> None:
        """The request is buffered whole: gunicorn parses it again in a pool thread, from the buffer."""
        self.forget(r)
        conn = r.conn
        conn.init()                         # plain HTTP/1: creates gunicorn's parser, no I/O
        conn.parser.unreader.unread(bytes(r.framing.data))
        conn.data_ready = True              # gthread: do not wait for the socket to be readable
        super().enqueue_req(conn)

    def forget(self, r: Reading) -> None:
        if self.reading.pop(r.conn, None) is None:
            return
        left = self.per_peer[r.peer] - 1
        if left:
            self.per_peer[r.peer] = left
        else:
            del self.per_peer[r.peer]
        try:
            self.poller.unregister(r.conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    # -- deadlines -----------------------------------------------------------------------------------
    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        now = time.monotonic()
        super().wait_for_and_dispatch_events(max(0.0, min(timeout, self.next_sweep - now)))
        now = time.monotonic()
        if not self.alive:                  # stopping: idle connections go now, incomplete requests get 2 s
            if self.stopping_at is None:
                self.stopping_at = now
            for r in self.reading.values():
                r.deadline = min(r.deadline, self.stopping_at + STOP_GRACE if r.started else now)
                self.next_sweep = min(self.next_sweep, r.deadline)
        if now >= self.next_sweep:
            self.sweep(now)

    def sweep(self, now: float) -> None:
        earliest = float("inf")
        for r in list(self.reading.values()):
            if r.deadline > now:
                earliest = min(earliest, r.deadline)
                continue
            self.forget(r)
            if r.started:
                t = self.limits.request_timeout
                self.throttled.note("408", f"answered 408 to {r.peer}: request not complete {t:g} s after "
                                    "its first byte", now)
                self.refuse(r.conn, 408, f"request not complete within {t:g} s of its first byte "
                                         "(remediator.request_timeout)")
            else:
                self.nr_conns -= 1
                r.conn.close()
        for sock, until in list(self.lingering.items()):
            if until <= now:
                self.close_lingering(sock)
            else:
                earliest = min(earliest, until)
        if self.accept_paused_until > now:
            earliest = min(earliest, self.accept_paused_until)
        self.next_sweep = earliest

    def set_accept_enabled(self, enabled: bool) -> None:
        if enabled and (len(self.reading) >= self.limits.max_pending_connections
                        or time.monotonic() < self.accept_paused_until):
            enabled = False
        super().set_accept_enabled(enabled)

    # -- answers and closing, never blocking the loop ------------------------------------------------
    def refuse(self, conn: GuardedConn, status: int, message: str) -> None:
        """Answer with a JSON error and close (the connection leaves nr_conns now)."""
        self.nr_conns -= 1
        self.send_now(conn.sock, json_answer(status, message))
        self.linger(conn.sock)

    @staticmethod
    def send_now(sock: socket.socket, data: bytes) -> None:
        """Whatever the socket buffer takes now (an answer of a few hundred bytes: all of it)."""
        try:
            sock.setblocking(False)
            sock.send(data)
        except OSError:
            pass

    def linger(self, sock: socket.socket) -> None:
        """Close after the peer has seen our answer: half-close, then read and drop its input (RFC 9112
        9.6) until it closes, 64 KiB or LINGER_SECONDS, watched by the event loop."""
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self.lingering) >= LINGER_MAX:
            self.close_lingering(next(iter(self.lingering)))
        until = time.monotonic() + LINGER_SECONDS
        self.lingering[sock] = until
        self.next_sweep = min(self.next_sweep, until)
        drained = [0]

        def drain(s: socket.socket) -> None:
            try:
                data = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            drained[0] += len(data)
            if not data or drained[0] >= 65536:
                self.close_lingering(s)

        try:
            self.poller.register(sock, selectors.EVENT_READ, drain)
        except (KeyError, ValueError, OSError):
            self.close_lingering(sock)

    def close_lingering(self, sock: socket.socket) -> None:
        self.lingering.pop(sock, None)
        try:
            self.poller.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass
        sock.close()

    # -- in the pool thread --------------------------------------------------------------------------
    def handle_request(self, req: Any, conn: Any) -> Any:
        """gunicorn's, with the body taken from the buffer first; the socket keeps its timeout, so writing
        the answer to a client that does not read it holds this thread at most request_timeout per write."""
        if getattr(conn, "continued", False):
            req._expected_100_continue = False    # sent already, when the head was complete
            conn.continued = False
        peer = peer_of(conn.client)
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
