"""Hostile HTTP servers on 127.0.0.1 for tests and benchmarks: they accept, then drip their answer.

One thread and one selector serve any number of listening ports (300 drippers cost one thread):

* `headers`: the status line and headers, one byte every `every` seconds (a wedged buffering proxy);
* `body`:    headers at once (Content-Length: 1 MB), then the body one byte every `every` seconds;
* `silent`:  accepts and never answers a byte (a TLS client waits for a handshake that never comes).

Every connection is closed by the server after `max_seconds`, and `stop()` ends everything, so a
test run never leaves a dripper behind. The request bytes are read and thrown away.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

HEADERS = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 1048576\r\n"
           b"X-Padding: " + b"x" * 200 + b"\r\n\r\n")


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    sent: int = 0
    next_at: float = 0.0
    requests: int = 0


@dataclass
class DripServer:
    ports: int = 1
    mode: str = "headers"
    every: float = 1.0
    max_seconds: float = 120.0
    urls: list[str] = field(default_factory=list)
    accepted: int = 0

    def __post_init__(self) -> None:
        assert self.mode in ("headers", "body", "silent")
        self._sel = selectors.DefaultSelector()
        self._listeners: list[socket.socket] = []
        self._conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        for _ in range(self.ports):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(64)
            s.setblocking(False)
            self._sel.register(s, selectors.EVENT_READ, "listen")
            self._listeners.append(s)
            self.urls.append(f"http://127.0.0.1:{s.getsockname()[1]}")
        self._thread = threading.Thread(target=self._run, name="drip", daemon=True)
        self._thread.start()

    def _payload(self) -> bytes:
        return HEADERS if self.mode == "headers" else (HEADERS + b"#" * 1048576)

    def _run(self) -> None:
        payload = self._payload()
        head = len(HEADERS)
        while not self._stop.is_set():
            now = time.monotonic()
            for key, _ in self._sel.select(timeout=min(0.05, self.every)):
                if key.data == "listen":
                    try:
                        sock, _addr = key.fileobj.accept()  # type: ignore[union-attr]
                    except OSError:
                        continue
                    sock.setblocking(False)
                    self.accepted += 1
                    self._conns[sock.fileno()] = _Conn(sock, now, next_at=now + self.every)
                    self._sel.register(sock, selectors.EVENT_READ, "conn")
                else:
                    conn = self._conns.get(key.fileobj.fileno())  # type: ignore[union-attr]
                    if conn is None:
                        continue
                    try:
                        data = conn.sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        self._close(conn)
            for conn in list(self._conns.values()):
                if now - conn.opened > self.max_seconds:
                    self._close(conn)
                    continue
                if self.mode == "silent" or now < conn.next_at:
                    continue
                if self.mode == "body" and conn.sent < head:
                    chunk = payload[:head]           # headers at once, then the body byte by byte
                else:
                    chunk = payload[conn.sent:conn.sent + 1]
                if not chunk:
                    continue
                try:
                    conn.sock.send(chunk)
                    conn.sent += len(chunk)
                    conn.next_at = now + self.every
                except OSError:
                    self._close(conn)
        for conn in list(self._conns.values()):
            self._close(conn)
        for s in self._listeners:
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def open_connections(self) -> int:
        return len(self._conns)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
