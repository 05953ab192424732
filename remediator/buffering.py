"""Connections in: the serving worker's event loop reads every request until it is whole, never a thread.

Each accepted connection (and each kept-alive one that is readable again) is registered with the worker's
selector; whatever arrives is read without blocking and given to `framing.RequestFraming`, which says
whether the head and the body are complete. A complete request is handed to a pool thread with its bytes
buffered (gunicorn parses it again there, from the buffer); a head over max_header_bytes gets 431, a body
over max_body_bytes 413 (never read), a request not complete `request_timeout` after its first byte 408,
and a connection that sends nothing for `idle_timeout` is closed. A client address with
max_pending_per_peer incomplete requests gets 503 for more; at max_pending_connections the worker stops
accepting until one completes. Refusals are logged at most every LOG_EVERY seconds per kind, with a count.
"""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gunicorn.workers.gthread import TConn, ThreadWorker

from llm_health.remediator.framing import Limits, RequestFraming, Step
from llm_health.remediator.lingering import Lingering, recv_now

LOG_EVERY = 10.0            # each kind of refusal is logged at most this often (with a count)


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


def peer_of(client: Any) -> str:
    return str(client[0]) if isinstance(client, tuple | list) and client else str(client)


class GuardedConn(TConn):  # type: ignore[misc]
    """gunicorn's connection, whose graceful close does not block the event loop, and whose socket has a
    timeout in the pool thread (reads never need it: the request is buffered already)."""

    def __init__(self, worker: Any, *args: Any) -> None:
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
class Pending:
    """A connection whose request has not fully arrived, watched by the event loop."""

    conn: GuardedConn
    peer: str
    framing: RequestFraming
    deadline: float
    started: bool = False          # a byte of this request has arrived


@dataclass
class Throttled:
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


class Buffering(Lingering):
    """Mixed into the serving worker (serving.py): `reading` maps each connection whose request is not whole
    yet to its Pending, `per_peer` counts them by client address, `next_sweep` is the earliest deadline."""

    limits: ServingLimits
    reading: dict[GuardedConn, Pending]
    per_peer: dict[str, int]
    accept_paused_until: float
    throttled: Throttled
    cfg: Any
    log: Any

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

    def read(self, conn: GuardedConn) -> None:
        buffered = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        number = conn.parser.req_count + 1 if conn.parser is not None else 1
        now = time.monotonic()
        framing = RequestFraming(self.cfg, conn.client, self.limits.framing, number)
        r = Pending(conn, peer_of(conn.client), framing, now + self.limits.idle_timeout)
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

    def on_readable(self, r: Pending, sock: socket.socket) -> None:
        if r.conn not in self.reading:
            return
        data = recv_now(sock)
        if data is None:
            return
        if not data:                        # the client went away (or reset) before its request was whole
            self.drop(r)
            return
        self.arrived(r, data, time.monotonic())

    def drop(self, r: Pending) -> None:
        self.forget(r)
        self.nr_conns -= 1
        r.conn.close()

    def arrived(self, r: Pending, data: bytes, now: float) -> None:
        try:
            self.judge(r, data, now)
        except Exception:   # noqa: BLE001 - a bug here must cost this connection, not the worker and all others
            self.log.exception("reading a request from %s failed; connection closed", r.peer)
            if r.conn in self.reading:
                self.drop(r)

    def judge(self, r: Pending, data: bytes, now: float) -> None:
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

    def hand_off(self, r: Pending) -> None:
        """The request is buffered whole: gunicorn parses it again in a pool thread, from the buffer."""
        self.forget(r)
        conn = r.conn
        conn.init()                         # plain HTTP/1: creates gunicorn's parser, no I/O
        conn.parser.unreader.unread(bytes(r.framing.data))
        conn.data_ready = True              # gthread: do not wait for the socket to be readable
        ThreadWorker.enqueue_req(self, conn)

    def forget(self, r: Pending) -> None:
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
