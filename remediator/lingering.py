"""Answering and closing a connection without ever blocking the worker's event loop.

A refused request gets its JSON answer (`{"error": ...}`, like the app's) written at once (a few hundred
bytes: the socket buffer takes them), then the socket lingers: half-closed, its unread input read and
dropped by the event loop (RFC 9112 9.6) until the peer closes, 64 KiB or LINGER_SECONDS, so the peer
sees the answer instead of a reset. gunicorn's own graceful close lingers up to 2 s in the loop itself.
"""

from __future__ import annotations

import json
import selectors
import socket
import time
from typing import Any

LINGER_SECONDS = 2.0        # a closed connection's unread input is drained this long at most
LINGER_MAX = 256            # sockets lingering at once; beyond, the oldest is closed outright

REASONS = {408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
           503: "Service Unavailable"}


def json_answer(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def recv_now(sock: socket.socket) -> bytes | None:
    """What the socket has now (at most 64 KiB), b"" when the peer closed or reset, None when nothing yet."""
    try:
        return sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class Lingering:
    """Mixed into the serving worker (serving.py), whose event loop (`poller`) watches the lingering sockets;
    `lingering` maps each to when it is closed at the latest, and `sweep()` (buffering.py) closes them."""

    poller: selectors.BaseSelector
    lingering: dict[socket.socket, float]
    next_sweep: float
    nr_conns: int

    def refuse(self, conn: Any, status: int, message: str) -> None:
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
            data = recv_now(s)
            if data is None:
                return
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
