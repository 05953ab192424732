"""llm_health.http_client: every exchange ends by its total deadline, whatever the server does."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from llm_health.drill.hostile import DripServer
from llm_health.http_client import FailureKind, HttpFailure, Target, fetch
from llm_health.httpserver import QuietHandler
from tests.support.loopback import Loopback

# A dripper sends its ~300 header bytes one every 0.2 s: a minute for the whole answer. A per-read
# timeout (http.client, requests) never fires on it; the total deadline of 1 s must.
DRIP_EVERY = 0.2
TIMEOUT = 1.0
BOUND = TIMEOUT + 2.0     # the deadline plus generous scheduling slack on a loaded machine


@pytest.fixture(params=["headers", "body", "silent"])
def dripper(request: pytest.FixtureRequest) -> Iterator[DripServer]:
    d = DripServer(ports=1, mode=request.param, every=DRIP_EVERY)
    yield d
    d.stop()


def test_a_dripping_server_never_holds_an_exchange_past_its_deadline(dripper: DripServer) -> None:
    target = Target(dripper.urls[0], TIMEOUT)
    started = time.monotonic()
    with pytest.raises(HttpFailure) as err:
        target.get("/metrics")
    took = time.monotonic() - started
    assert err.value.kind == FailureKind.TIMEOUT, err.value.detail
    assert took < BOUND, f"{dripper.mode}: the exchange took {took:.1f} s with a {TIMEOUT} s deadline"


def test_a_tls_handshake_that_never_comes_ends_at_the_deadline() -> None:
    d = DripServer(ports=1, mode="silent")
    try:
        target = Target(d.urls[0].replace("http://", "https://"), TIMEOUT)
        started = time.monotonic()
        with pytest.raises(HttpFailure) as err:
            target.get("/health")
        assert err.value.kind == FailureKind.TIMEOUT
        assert time.monotonic() - started < BOUND
    finally:
        d.stop()


def test_fetch_has_the_same_total_deadline() -> None:
    d = DripServer(ports=1, mode="headers", every=DRIP_EVERY)
    try:
        started = time.monotonic()
        with pytest.raises(HttpFailure) as err:
            fetch("GET", d.urls[0] + "/api/v1/targets", timeout=TIMEOUT, params={"state": "active"})
        assert err.value.kind == FailureKind.TIMEOUT
        assert time.monotonic() - started < BOUND
    finally:
        d.stop()


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str | None, str]] = []

    def _answer(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Process-Start-Time-Unix", "12345")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(("GET", self.path, self.headers.get("Authorization"), self.client_address[1].__str__()))
        if self.path == "/big":
            self._answer(200, b"x" * 4096)
        elif self.path == "/cut":             # the connection drops before the announced Content-Length
            self.send_response(200)
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b"vllm:generation_tokens_total 12")
            self.close_connection = True
        else:
            self._answer(200, json.dumps({"path": self.path}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append(("POST", self.path, self.headers.get("Content-Type"), body.decode()))
        self._answer(201, body)


@pytest.fixture
def server() -> Iterator[Loopback]:
    _Handler.seen = []
    srv = Loopback(_Handler)
    yield srv
    srv.stop()


def test_a_normal_server_keeps_its_connection_and_the_key_goes_to_v1_only(server: Loopback) -> None:
    target = Target(server.url, 5.0, api_key="sekrit")
    first = target.get("/metrics")
    second = target.get("/v1/models")
    assert first.status == second.status == 200
    assert first.json() == {"path": "/metrics"} and first.header("process-start-time-unix") == "12345"
    (_, _, auth1, port1), (_, _, auth2, port2) = _Handler.seen
    assert auth1 is None and auth2 == "Bearer sekrit"
    assert port1 == port2, "the kept-alive connection was not reused"
    target.close()


def test_an_answer_over_the_size_cap_is_an_error(server: Loopback) -> None:
    target = Target(server.url, 5.0, max_bytes=1024)
    with pytest.raises(HttpFailure) as err:
        target.get("/big")
    assert err.value.kind == FailureKind.ERROR and "larger than 1024" in err.value.detail


def test_an_answer_cut_short_of_its_content_length_is_an_error_not_a_page(server: Loopback) -> None:
    """http.client hands back b"" when the server closes early: the first 31 bytes were taken for the whole
    page, with a counter cut mid-value (123458 -> 12), and the exporter judged the engine restarted."""
    target = Target(server.url, 5.0)
    with pytest.raises(HttpFailure) as err:
        target.get("/cut")
    assert err.value.kind == FailureKind.ERROR and "cut short" in err.value.detail, err.value.detail
    assert target.get("/metrics").json() == {"path": "/metrics"}      # and the next exchange works
    target.close()


def test_fetch_sends_json_and_query(server: Loopback) -> None:
    resp = fetch("POST", server.url + "/api/v2/silences", timeout=5.0, json_body={"a": 1}, params={"x": "y z"})
    assert resp.status == 201 and resp.json() == {"a": 1}
    method, path, ctype, body = _Handler.seen[-1]
    assert (method, path, ctype, json.loads(body)) == ("POST", "/api/v2/silences?x=y+z", "application/json", {"a": 1})


def test_refused_is_refused() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    with pytest.raises(HttpFailure) as err:
        Target(f"http://127.0.0.1:{port}", 2.0).get("/health")
    assert err.value.kind == FailureKind.REFUSED


def test_only_http_urls_make_a_target() -> None:
    for bad in ("ftp://x", "http://", "127.0.0.1:8000"):
        with pytest.raises(ValueError):
            Target(bad, 1.0)


def test_credentials_in_the_url_go_as_basic_auth_never_as_a_host_name(server: Loopback) -> None:
    url = server.url.replace("http://", "http://scraper:s%3Acret@")
    Target(url, 5.0).get("/metrics")
    fetch("GET", url + "/api/v1/targets", timeout=5.0)
    assert [auth for _, _, auth, _ in _Handler.seen] == ["Basic c2NyYXBlcjpzOmNyZXQ="] * 2
