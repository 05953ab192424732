"""HTTP I/O of the exporter against tiny real servers: keep-alive reuse, timeouts, 404, refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from llm_health.drill.procs import free_port
from llm_health.exporter.backend import Target, observe
from llm_health.exporter.observation import ReadResult
from llm_health.httpserver import QuietHandler
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import render
from tests.support.loopback import Loopback


def _page() -> bytes:
    e = Engine(flavour="v1")
    e.submit(prompt_tokens=100, max_tokens=100)
    e.advance_to(0.3)
    return render(e, "v1", process_start_time=1.7e9).encode()


class Server:
    """HTTP/1.1 keep-alive server (like uvicorn) with a per-path behaviour."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.connections = 0
        self.requests = 0
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                outer.connections += 1

            def do_GET(self) -> None:  # noqa: N802
                outer.requests += 1
                route = routes.get(self.path, (404, b"not found"))
                if callable(route):
                    route(self)
                    return
                status, body = route
                self.reply(status, body)

        self.loop = Loopback(Handler)
        self.url = self.loop.url

    def stop(self) -> None:
        self.loop.stop()


@pytest.fixture
def server() -> Iterator[Any]:
    made: list[Server] = []

    def make(routes: dict[str, Any]) -> Server:
        s = Server(routes)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def test_kept_alive_connection_is_reused(server) -> None:
    s = server({"/metrics": (200, _page())})
    target = Target(s.url, 2.0)
    for _ in range(3):
        obs = observe(target)
        assert obs.outcome == ReadResult.OK and obs.reading is not None and obs.reading.running == 1
    assert s.requests == 3 and s.connections == 1
    target.close()


def test_not_found_asks_the_cheap_endpoints(server) -> None:
    s = server({"/health": (200, b"")})
    obs = observe(Target(s.url, 2.0))
    assert obs.outcome == ReadResult.NOT_FOUND and obs.cheap_ok is True
    s2 = server({"/metrics": (200, b"python_info 1\n"), "/health": (503, b""), "/v1/models": (500, b"")})
    obs = observe(Target(s2.url, 2.0))
    assert obs.outcome == ReadResult.OK and obs.reading is not None and not obs.reading.has_engine_metrics
    assert obs.cheap_ok is False


def test_refused_and_timeouts(server) -> None:
    assert observe(Target(f"http://127.0.0.1:{free_port()}", 1.0)).outcome == ReadResult.REFUSED

    def silent(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(1.5)

    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        for _ in range(100):
            try:
                handler.wfile.write(b"#" * 10 + b"\n")
                handler.wfile.flush()
            except OSError:
                return
            time.sleep(0.05)

    s = server({"/metrics": silent})
    assert observe(Target(s.url, 0.3)).outcome == ReadResult.TIMEOUT
    s2 = server({"/metrics": drip})
    started = time.monotonic()
    obs = observe(Target(s2.url, 0.3))
    assert obs.outcome == ReadResult.TIMEOUT, obs  # each line arrives in time, the whole page does not
    assert time.monotonic() - started < 4.0  # cut off: the server needs 5 s to send it all


@pytest.mark.parametrize(("route", "entry", "model"), [
    ((200, b'{"data": [{"id": "m", "owned_by": "llamacpp"}, {"id": "n"}]}'), {"id": "m", "owned_by": "llamacpp"}, "m"),
    ((200, b'{"data": [{"owned_by": "vllm"}]}'), {"owned_by": "vllm"}, None),
    ((200, b'{"data": []}'), None, None),
    ((200, b'{"data": ["m"]}'), None, None),
    ((200, b"not json"), None, None),
    ((500, b'{"data": [{"id": "m"}]}'), None, None),
], ids=["listed", "no-id", "empty", "not-an-object", "not-json", "http-500"])
def test_first_model_entry_and_first_model(server, route: tuple[int, bytes], entry: Any, model: Any) -> None:
    from llm_health.exporter.backend import HttpFailure, first_model, first_model_entry

    target = Target(server({"/v1/models": route}).url, 2.0)
    if entry is None:
        with pytest.raises(HttpFailure):
            first_model_entry(target)
    else:
        assert first_model_entry(target) == entry
    if model is None:
        with pytest.raises(HttpFailure):
            first_model(target)
    else:
        assert first_model(target) == model
    target.close()


def _page_server(body: bytes) -> Loopback:
    class Page(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Loopback(Page)


def test_a_page_inventing_engines_by_the_thousand_is_an_error_never_judged() -> None:
    """300 000 `engine` label values under the size cap made 300 000 engine readings: judge() took 1.7 s on
    the scheduler's only thread, under its lock, and the state kept half a GB. One hostile backend."""
    from llm_health.exporter.reading import MAX_ENGINES

    rows = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\nvllm:generation_tokens_total{{engine="{i}"}} 5\n'
                   for i in range(MAX_ENGINES + 1))
    srv = _page_server(("# HELP vllm:num_requests_running x\n" + rows).encode())
    target = Target(srv.url, 5.0)
    try:
        obs = observe(target)
        assert obs.outcome == ReadResult.ERROR and "engines on one page" in obs.detail, obs
    finally:
        target.close()
        srv.stop()


def test_a_page_over_the_exporters_cap_is_an_error() -> None:
    from llm_health.exporter.backend import PAGE_MAX_BYTES

    srv = _page_server(b"# " + b"x" * PAGE_MAX_BYTES + b"\n")
    target = Target(srv.url, 5.0)
    try:
        obs = observe(target)
        assert obs.outcome == ReadResult.ERROR and f"larger than {PAGE_MAX_BYTES}" in obs.detail, obs
    finally:
        target.close()
        srv.stop()


def test_a_page_without_engine_metrics_and_hung_cheap_endpoints_costs_one_read_timeout() -> None:
    """/metrics answered without engine series, then /health and /v1/models each held the connection to the
    target's timeout: one reading took up to three read timeouts, and the scheduler judged it a timeout."""
    import threading

    release = threading.Event()

    class NoEngine(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/metrics":
                release.wait(10)                 # hangs: the client's deadline ends it
                return
            body = b"# HELP up x\nup 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = Loopback(NoEngine)
    target = Target(srv.url, 2.0)
    try:
        started = time.monotonic()
        obs = observe(target)
        took = time.monotonic() - started
        assert obs.outcome == ReadResult.OK and obs.cheap_ok is False, obs
        assert took < 3.0, f"one reading took {took:.1f} s with a 2 s read timeout (a deadline, not a speed)"
    finally:
        release.set()
        target.close()
        srv.stop()
