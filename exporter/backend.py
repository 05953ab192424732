"""HTTP I/O to one server (`/metrics`, `/health`, `/v1/models`) with timeouts, nothing else.

Plain `http.client` with one kept-alive connection per target: at 1000 backends per interval the
cost of a request matters more than convenience. One `Target` is used by one thread at a time
(the cycle never has two reads of one backend in flight); the probe has its own `Target`.

With an API key (vLLM `--api-key` protects `/v1/*` only) the key goes as `Authorization: Bearer`
on `/v1/*` requests; `/metrics` and `/health` stay unauthenticated, as in vLLM.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from llm_health.exporter.reading import read_text
from llm_health.exporter.verdict import (
    READ_ERROR,
    READ_NOT_FOUND,
    READ_OK,
    READ_REFUSED,
    READ_TIMEOUT,
    Observation,
)

from llm_health.config import ConfigError

USER_AGENT = "llm-health-exporter"


class HttpFailure(Exception):
    """A request failed; `kind` is refused | timeout | error; `status` the HTTP status if one came back."""

    def __init__(self, kind: str, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status


START_HEADER = "Process-Start-Time-Unix"  # llama-server: changes on every restart (no identity series)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    seconds: float
    start_header: str | None = None


class Target:
    """One HTTP server; a kept-alive connection, reopened after any failure."""

    def __init__(self, url: str, timeout: float, api_key: str = "") -> None:
        parsed = urlparse(url)
        self.api_key = api_key
        self.url = url.rstrip("/")
        self.https = parsed.scheme == "https"
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or (443 if self.https else 80)
        self.base = parsed.path.rstrip("/")
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        timeout = self.timeout if timeout is None else timeout
        all_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if self.api_key and path.startswith("/v1/"):
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        if headers:
            all_headers.update(headers)
        started = time.monotonic()
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._conn or self._connect(timeout)
            self._conn = conn
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                else:
                    conn.timeout = timeout
                conn.request(method, self.base + path, body=body, headers=all_headers)
                resp = conn.getresponse()
                data = _read_body(resp, started + 2 * timeout)
                if resp.will_close:
                    self.close()
                return Response(resp.status, data, time.monotonic() - started, resp.getheader(START_HEADER))
            except ConnectionRefusedError as exc:
                self.close()
                raise HttpFailure("refused", "connection refused") from exc
            except TimeoutError as exc:
                self.close()
                raise HttpFailure("timeout", f"no answer within {timeout:g} s") from exc
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if reused and attempt == 0 and method == "GET":
                    continue  # the server closed an idle kept-alive connection: retry once, fresh
                raise HttpFailure("error", f"{type(exc).__name__}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise HttpFailure("error", f"{type(exc).__name__}: {exc}") from exc
        raise HttpFailure("error", "unreachable")  # pragma: no cover

    def get(self, path: str, timeout: float | None = None) -> Response:
        return self.request("GET", path, timeout=timeout)


def _read_body(resp: http.client.HTTPResponse, deadline: float) -> bytes:
    """The whole body, but never past `deadline` (a server dripping bytes must not hold a thread)."""
    chunks: list[bytes] = []
    while True:
        chunk = resp.read1(262144)
        if not chunk:
            resp.read()  # marks the response complete, so the kept-alive connection can be reused
            return b"".join(chunks)
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError("body still arriving at the deadline")


_KIND_TO_READ = {"refused": READ_REFUSED, "timeout": READ_TIMEOUT, "error": READ_ERROR}


def cheap_ok(target: Target) -> bool:
    """/health or /v1/models answers 200: the server's HTTP side lives (no generation involved)."""
    for path in ("/health", "/v1/models"):
        try:
            if target.get(path).status == 200:
                return True
        except HttpFailure:
            continue
    return False


def load_api_key(path: str | Path, where: str = "api_key_file") -> str:
    """The API key in `path` (stripped); "" for no path. A missing, unreadable or empty file is an error."""
    if not str(path):
        return ""
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read {str(path)!r}: {exc.__class__.__name__}") from None
    if not key or any(c in key for c in "\r\n"):
        raise ConfigError(f"{where}: {str(path)!r} must hold one non-empty line")
    return key


def health_ok(target: Target) -> bool:
    """GET /health answers 200 within the target's timeout (the cheapest sign of a live HTTP side)."""
    try:
        return target.get("/health").status == 200
    except HttpFailure:
        return False


def observe(target: Target) -> Observation:
    """Read /metrics once; when the page has no engine series, ask the cheap endpoints instead."""
    try:
        resp = target.get("/metrics")
    except HttpFailure as exc:
        return Observation(outcome=_KIND_TO_READ[exc.kind], detail=exc.detail)
    if resp.status == 404:
        return Observation(outcome=READ_NOT_FOUND, detail="404", cheap_ok=cheap_ok(target))
    if resp.status != 200:
        return Observation(outcome=READ_ERROR, detail=f"HTTP {resp.status}")
    try:
        reading = read_text(resp.body.decode("utf-8", errors="replace"), resp.start_header)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not kill the cycle
        return Observation(outcome=READ_ERROR, detail=f"unreadable page: {exc}")
    if not reading.has_engine_metrics:
        return Observation(outcome=READ_OK, reading=reading, cheap_ok=cheap_ok(target))
    return Observation(outcome=READ_OK, reading=reading)


def first_model_entry(target: Target) -> dict[str, Any]:
    """The first entry of /v1/models' `data` list (`id`, `owned_by`, ...)."""
    resp = target.get("/v1/models")
    if resp.status != 200:
        raise HttpFailure("error", f"/v1/models: HTTP {resp.status}", resp.status)
    try:
        entry = json.loads(resp.body)["data"][0]
        if not isinstance(entry, dict):
            raise TypeError(f"a model entry is {type(entry).__name__}")
        return entry
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise HttpFailure("error", "/v1/models lists no model") from exc


def first_model(target: Target) -> str:
    """The first model id listed by /v1/models."""
    entry = first_model_entry(target)
    if "id" not in entry:
        raise HttpFailure("error", "/v1/models lists no model")
    return str(entry["id"])


def proxy_up(target: Target) -> bool:
    """A proxy is up when GET /v1/models answers 200 through it."""
    try:
        return target.get("/v1/models").status == 200
    except HttpFailure:
        return False
