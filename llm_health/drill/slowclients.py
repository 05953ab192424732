"""Slow HTTP clients on loopback, for the tests and the benchmark that check the remediator stays responsive.

`SlowClients` keeps `n` connections open to a loopback address, each sending one more piece of a
request every `interval` seconds and never finishing it: a header byte, a header line, or (after
complete headers) a body byte. A connection the server closes is opened again one interval later,
so the pressure stays constant. Everything runs in one thread with a selector and stops by itself
after `seconds` (or at `stop()`): a test that fails cannot leave it running. Only loopback targets.
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum


class Drip(Enum):
    HEADER_BYTES = "header-bytes"    # the request line and headers, one byte at a time, never ending
    HEADER_LINES = "header-lines"    # one header line at a time, never the empty line
    BODY_BYTES = "body-bytes"        # complete headers (Content-Length: 100000), then one body byte at a time
    SILENT = "silent"                # connects and sends nothing


def pieces(drip: Drip, host: str) -> Iterator[bytes]:
    """What one connection sends, one piece per interval (endless)."""
    if drip is Drip.SILENT:
        while True:
            yield b""
    if drip is Drip.BODY_BYTES:
        yield (f"POST /webhook HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: 100000\r\n\r\n").encode()
        while True:
            yield b" "
    head = f"POST /webhook HTTP/1.1\r\nHost: {host}\r\n".encode()
    if drip is Drip.HEADER_LINES:
        yield head[:head.index(b"\n") + 1]
        yield head[head.index(b"\n") + 1:]
        n = 0
        while True:
            n += 1
            yield f"X-Drip-{n}: a\r\n".encode()
    for i in range(len(head)):
        yield head[i:i + 1]
    yield b"X-Drip: "
    while True:
        yield b"a"


@dataclass
class _Conn:
    sock: socket.socket
    source: str
    pieces: Iterator[bytes]
    next_at: float


@dataclass
class Stats:
    opened: int = 0              # connections opened (reconnects included)
    open_now: int = 0
    failed_connects: int = 0
    closed_by_server: int = 0    # connections the server closed (or reset)
    bytes_sent: int = 0
    answers: Counter[str] = field(default_factory=Counter)   # first line of what the server said before closing


class SlowClients:
    def __init__(self, host: str, port: int, n: int, *, drip: Drip = Drip.HEADER_BYTES, interval: float = 1.0,
                 sources: tuple[str, ...] = ("127.0.0.1",), seconds: float = 60.0) -> None:
        for address in (host, *sources):
            if not ipaddress.ip_address(address).is_loopback:
                raise ValueError(f"SlowClients: loopback addresses only, got {address!r}")
        self.host, self.port, self.n = host, port, n
        self.drip, self.interval, self.sources, self.seconds = drip, interval, sources, seconds
        self.stats = Stats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)

    def start(self) -> SlowClients:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> SlowClients:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> Stats:
        with self._lock:
            return Stats(self.stats.opened, self.stats.open_now, self.stats.failed_connects,
                         self.stats.closed_by_server, self.stats.bytes_sent, Counter(self.stats.answers))

    def _open(self, source: str, at: float) -> _Conn | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((source, 0))
            sock.settimeout(2.0)
            sock.connect((self.host, self.port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            with self._lock:
                self.stats.failed_connects += 1
            return None
        with self._lock:
            self.stats.opened += 1
            self.stats.open_now += 1
        return _Conn(sock, source, pieces(self.drip, self.host), at)

    def _run(self) -> None:
        deadline = time.monotonic() + self.seconds
        sel = selectors.DefaultSelector()
        conns: dict[int, _Conn] = {}
        reopen: list[tuple[float, str]] = [
            (time.monotonic() + i * self.interval / max(1, self.n), self.sources[i % len(self.sources)])
            for i in range(self.n)]

        def close(c: _Conn, by_server: bool, answer: bytes = b"") -> None:
            sel.unregister(c.sock)
            del conns[c.sock.fileno()]
            c.sock.close()
            with self._lock:
                self.stats.open_now -= 1
                if by_server:
                    self.stats.closed_by_server += 1
                if answer:
                    self.stats.answers[answer.split(b"\r\n", 1)[0].decode(errors="replace")[:60]] += 1
            reopen.append((time.monotonic() + self.interval, c.source))

        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                due = [r for r in reopen if r[0] <= now]
                reopen[:] = [r for r in reopen if r[0] > now]
                for at, source in due:
                    c = self._open(source, at)
                    if c is None:
                        reopen.append((now + self.interval, source))
                        continue
                    conns[c.sock.fileno()] = c
                    sel.register(c.sock, selectors.EVENT_READ, c)
                for c in list(conns.values()):
                    if c.next_at > now:
                        continue
                    c.next_at += self.interval
                    piece = next(c.pieces)
                    try:
                        sent = c.sock.send(piece) if piece else 0
                    except BlockingIOError:
                        sent = 0
                    except OSError:
                        close(c, by_server=True)
                        continue
                    with self._lock:
                        self.stats.bytes_sent += sent
                wake = min([c.next_at for c in conns.values()] + [r[0] for r in reopen] + [deadline])
                for key, _ in sel.select(timeout=max(0.0, min(wake - time.monotonic(), 0.5))):
                    c = key.data
                    try:
                        data = c.sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        close(c, by_server=True)
                        continue
                    if not data:
                        close(c, by_server=True)
                    else:                      # an answer (408, 413, ...): the server closes after it
                        close(c, by_server=True, answer=data)
        finally:
            for c in list(conns.values()):
                c.sock.close()
            with self._lock:
                self.stats.open_now = 0
            sel.close()
