"""HTTP/1.1 with a TOTAL deadline: name resolution, connect, request, status line, headers and body.

Every exchange llm-health starts (the exporter's readings and probes, the remediator's verification,
warm-up, readiness and in-flight checks, Alertmanager silences, Prometheus discovery) goes through
`Target.request()` or `fetch()`, and each one ends by its deadline however the other side behaves.
The standard clients cannot promise that: `http.client` and `requests` apply their timeout to each
socket read, so a server that sends its headers one byte every second holds a request (and the thread
running it) for as long as it likes; a body deadline starts only after the headers.

How: the socket is ours (`_DeadlineSocket`, and `_DeadlineSSLSocket` for https). Before every send and
receive it sets its timeout to what is left of the exchange's deadline, and once the deadline has
passed it raises `TimeoutError` at once. `http.client` still parses the answer (status line, header
limits of 100 lines of 64 KiB, chunked bodies), so none of its validation is lost. The TLS handshake
runs non-blocking against the deadline. A host name is resolved in a small shared pool and waited for
only until the deadline (an IP literal needs no resolution). Bodies are capped (`max_bytes`).

One `Target` is one server with one kept-alive connection, used by one thread at a time.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import select
import socket
import ssl
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode, urlparse

from llm_health.urlauth import split_credentials

USER_AGENT = "llm-health"
DEFAULT_MAX_BYTES = 32 * 1024 * 1024     # a /metrics page is ~100 KB; nothing we read is near this
RESOLVERS = 8                            # name resolutions in flight at once (a hung resolver holds one)


class FailureKind(StrEnum):
    REFUSED = "refused"       # nothing listens (connection refused)
    TIMEOUT = "timeout"       # the exchange did not end by its deadline
    ERROR = "error"           # anything else: reset, bad HTTP, too large, TLS, name not found


class HttpFailure(Exception):
    """An exchange failed; `kind` says how, `status` is the HTTP status if one came back."""

    def __init__(self, kind: FailureKind | str, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.kind = FailureKind(kind)
        self.detail = detail
        self.status = status


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    seconds: float
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


# ---- sockets that know the deadline --------------------------------------------------------------


class _Deadline:
    """Mixed into a socket class: every send/receive gets only the time left of `deadline`."""

    deadline: float = float("inf")

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the exchange's deadline passed")
        super().settimeout(min(left, 3600.0))  # type: ignore[misc]

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def recv_into(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().send(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().sendall(*args, **kwargs)  # type: ignore[misc]


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    def read(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().read(*args, **kwargs)

    def write(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().write(*args, **kwargs)


_resolver = ThreadPoolExecutor(max_workers=RESOLVERS, thread_name_prefix="resolve")


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"deadline passed before {what}")
    return left


def _addresses(host: str, port: int, deadline: float) -> list[tuple[Any, ...]]:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is not None:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 0, "", (str(ip), port))]
    future = _resolver.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        return list(future.result(timeout=_left(deadline, "name resolution")))
    except FutureTimeout:
        raise TimeoutError(f"name resolution of {host!r} did not finish by the deadline") from None


def open_socket(host: str, port: int, deadline: float, tls: ssl.SSLContext | None = None) -> socket.socket:
    """A connected socket (TLS done) whose every operation is bounded by `deadline` (monotonic)."""
    last: BaseException | None = None
    for family, kind, proto, _name, addr in _addresses(host, port, deadline):
        raw = socket.socket(family, kind, proto)
        try:
            raw.settimeout(_left(deadline, "connect"))
            raw.connect(addr)
        except OSError as exc:
            raw.close()
            last = exc
            if isinstance(exc, TimeoutError):
                raise
            continue
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is None:
            sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
            sock.deadline = deadline
            return sock
        return _handshake(raw, host, deadline, tls)
    raise last if last is not None else OSError(f"no address for {host!r}")


def _handshake(raw: socket.socket, host: str, deadline: float, tls: ssl.SSLContext) -> socket.socket:
    raw.setblocking(False)
    try:
        sock = tls.wrap_socket(raw, server_hostname=host.strip("[]"), do_handshake_on_connect=False)
    except OSError:
        raw.close()
        raise
    try:
        while True:
            try:
                sock.do_handshake()
                break
            except ssl.SSLWantReadError:
                ready = select.select([sock], [], [], _left(deadline, "the TLS handshake"))[0]
            except ssl.SSLWantWriteError:
                ready = select.select([], [sock], [], _left(deadline, "the TLS handshake"))[1]
            if not ready:
                raise TimeoutError("the TLS handshake did not finish by the deadline")
    except BaseException:
        sock.close()
        raise
    sock.setblocking(True)
    assert isinstance(sock, _DeadlineSSLSocket)
    sock.deadline = deadline
    return sock


def _tls_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.sslsocket_class = _DeadlineSSLSocket
    return ctx


class _Connection(http.client.HTTPConnection):
    """http.client's request writing and answer parsing over our deadline socket."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        super().__init__(host, port)
        self.tls = tls
        self.deadline = float("inf")

    def connect(self) -> None:
        self.sock = open_socket(self.host, self.port, self.deadline, self.tls)

    def arm(self, deadline: float) -> None:
        self.deadline = deadline
        if isinstance(self.sock, _Deadline):
            self.sock.deadline = deadline


def _read_body(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read1(262144)
        if not chunk:
            if resp.length:   # http.client answers b"" when the server closes before its Content-Length
                raise HttpFailure(FailureKind.ERROR, f"answer cut short: {size} bytes, {resp.length} more "
                                  "announced by Content-Length")
            resp.read()   # marks the response complete, so the kept-alive connection can be reused
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise HttpFailure(FailureKind.ERROR, f"answer larger than {max_bytes} bytes")
        chunks.append(chunk)


# ---- one server ----------------------------------------------------------------------------------


class Target:
    """One HTTP server (`url` may carry a path prefix); a kept-alive connection, reopened after any failure.

    `timeout` is each exchange's total deadline unless a request gives its own. With `api_key`, the key
    goes as `Authorization: Bearer` on `/v1/*` requests only (vLLM's `--api-key` protects `/v1/*`).
    `user:password@` in the URL goes as HTTP Basic auth (the Bearer key wins on `/v1/*`)."""

    def __init__(self, url: str, timeout: float, api_key: str = "", user_agent: str = USER_AGENT,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        url, self._basic = split_credentials(url)   # user:password@ goes as Basic auth, never as a host name
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("not an http(s) URL with a host")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.https = parsed.scheme == "https"
        self.host = parsed.hostname
        self.port = parsed.port or (443 if self.https else 80)
        self.base = parsed.path.rstrip("/")
        self.timeout = timeout
        self.user_agent = user_agent
        self.max_bytes = max_bytes
        self._tls = _tls_context() if self.https else None
        self._conn: _Connection | None = None

    @property
    def endpoint(self) -> str:
        """host:port, the unit the exporter caps concurrent reads by."""
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None, timeout: float | None = None) -> Response:
        """One exchange, over within `timeout` (default: the target's) from now, whatever the server does."""
        timeout = self.timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout
        all_headers = {"User-Agent": self.user_agent, "Accept-Encoding": "identity", **self._basic}
        if self.api_key and path.startswith("/v1/"):
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        if headers:
            all_headers.update(headers)
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._conn or _Connection(self.host, self.port, self._tls)
            self._conn = conn
            conn.arm(deadline)
            try:
                conn.request(method, self.base + path, body=body, headers=all_headers)
                resp = conn.getresponse()
                data = _read_body(resp, self.max_bytes)
                if resp.will_close:
                    self.close()
                return Response(resp.status, data, time.monotonic() - started, tuple(resp.getheaders()))
            except HttpFailure:
                self.close()
                raise
            except ConnectionRefusedError as exc:
                self.close()
                raise HttpFailure(FailureKind.REFUSED, "connection refused") from exc
            except TimeoutError as exc:
                self.close()
                raise HttpFailure(FailureKind.TIMEOUT, f"no whole answer within {timeout:g} s") from exc
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if reused and attempt == 0 and method == "GET" and time.monotonic() < deadline:
                    continue  # the server closed an idle kept-alive connection: retry once, fresh
                raise HttpFailure(FailureKind.ERROR, f"{type(exc).__name__}: {exc}") from exc
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self.close()
                raise HttpFailure(FailureKind.ERROR, f"{type(exc).__name__}: {exc}") from exc
        raise HttpFailure(FailureKind.ERROR, "unreachable")  # pragma: no cover

    def get(self, path: str, timeout: float | None = None) -> Response:
        return self.request("GET", path, timeout=timeout)


def fetch(method: str, url: str, *, timeout: float, json_body: Any = None,
          headers: Mapping[str, str] | None = None, params: Mapping[str, str] | None = None,
          max_bytes: int = DEFAULT_MAX_BYTES, user_agent: str = USER_AGENT) -> Response:
    """One exchange on a fresh connection (closed afterwards), over within `timeout`: for the calls we
    make now and then (Alertmanager silences, Prometheus discovery, the remediator's API)."""
    parsed = urlparse(url)
    root = f"{parsed.scheme}://{parsed.netloc}"
    path = parsed.path or "/"
    query = parsed.query
    if params:
        query = (query + "&" if query else "") + urlencode(params)
    if query:
        path += "?" + query
    all_headers = dict(headers or {})
    body = None
    if json_body is not None:
        body = json.dumps(json_body).encode()
        all_headers.setdefault("Content-Type", "application/json")
    target = Target(root, timeout, user_agent=user_agent, max_bytes=max_bytes)
    try:
        return target.request(method, path, body=body, headers=all_headers)
    finally:
        target.close()

