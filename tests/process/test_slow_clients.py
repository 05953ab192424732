"""Slow and dripping clients against a real `llm-health remediator` (gunicorn, its default 2 workers x 16
threads) on loopback:

* 200 slow clients (header bytes, header lines, body bytes: one piece per second each) never slow
  /healthz: it answers within 1 s every time, over a window longer than `request_timeout`;
* an oversized chunked body gets 413 with a JSON error, like an oversized Content-Length body;
* gunicorn's control socket is off: nothing is created in $HOME or $XDG_RUNTIME_DIR;
* the worker's limits (request_timeout, idle_timeout, header and body size, incomplete requests per
  worker and per peer) with small settings, and normal clients (keep-alive, pipelining, chunked
  bodies, Expect: 100-continue, gunicorn's own request validation) as before;
* a dozen connections dripping their headers (reconnecting when cut off) starve neither /healthz nor
  /webhook of a remediator with a short request_timeout.

That the settings reach gunicorn is checked in-process (tests/unit/remediator/test_cli.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.drill.slowclients import Drip, SlowClients
from llm_health.remediator.serving import YIELD_FOR
from tests.support.alerts import alert, payload
from tests.support.paths import REPO
from tests.support.remediator_process import AUTH, TOKEN, running, write_config


@dataclass
class Served:
    url: str
    port: int
    proc: ManagedProcess
    home: Path
    runtime: Path


@contextmanager
def serving(tmp: Path, *flags: Any, runtime_dir: bool = False, **remediator: Any) -> Iterator[Served]:
    """A real remediator with HOME (and XDG_RUNTIME_DIR, if `runtime_dir`, else unset) pointed at empty
    folders of its own: gunicorn's control socket would go to $XDG_RUNTIME_DIR, else to ~/.gunicorn/."""
    home, runtime = tmp / "home", tmp / "runtime"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", write_config(tmp, **remediator),
                                     "--listen", f"127.0.0.1:{port}", *flags),
                          name="remediator", log_dir=tmp, cwd=REPO,
                          env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime) if runtime_dir else ""})
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield Served(f"http://127.0.0.1:{port}", port, proc, home, runtime)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def remediator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("slow-clients")) as s:   # every setting at its default
        yield s


def healthz_for(url: str, seconds: float) -> list[tuple[float, int]]:
    """/healthz asked again and again (a new connection each time) for `seconds`: (latency, status)."""
    out: list[tuple[float, int]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            status = requests.get(url + "/healthz", timeout=5).status_code
        except requests.RequestException:
            status = 0
        out.append((time.monotonic() - start, status))
    return out


@pytest.mark.timeout(150)
def test_200_slow_clients_never_slow_healthz(remediator: Served) -> None:
    # 10 peers (127.0.0.2-11), 20 connections each, three kinds of drip; 200 > 2 workers x 16 threads
    sources = tuple(f"127.0.0.{i}" for i in range(2, 12))
    kinds = ((Drip.HEADER_BYTES, 100), (Drip.HEADER_LINES, 50), (Drip.BODY_BYTES, 50))
    drips = [SlowClients("127.0.0.1", remediator.port, n, drip=kind, sources=sources, seconds=60) for kind, n in kinds]
    try:
        for d in drips:
            d.start()
        wait_until(lambda: sum(d.snapshot().opened for d in drips) >= 200, timeout=30, what="200 slow clients connected")
        wait_until(lambda: all(d.snapshot().bytes_sent >= 3 * d.n for d in drips), timeout=30,
                   what="every slow client sending")
        samples = healthz_for(remediator.url, 13.0)        # longer than request_timeout (10 s): cut-offs included
        open_now = sum(d.snapshot().open_now for d in drips)
        cut = sum(d.snapshot().closed_by_server for d in drips)
    finally:
        for d in drips:
            d.stop()
    worst = max(latency for latency, _ in samples)
    answers = {kind.value: dict(d.snapshot().answers) for (kind, _), d in zip(kinds, drips, strict=True)}
    assert worst < 1.0, (f"worst /healthz {worst:.2f}s over {len(samples)} samples", samples[:20], answers)
    assert all(status == 200 for _, status in samples), (samples, answers)
    assert open_now >= 150, f"the slow clients were not all connected: {open_now} open"
    assert cut >= 150, f"slow clients cut off by request_timeout: {cut}; {answers}"


def chunked(size: int, piece: int = 65536) -> Iterator[bytes]:
    sent = 0
    while sent < size:
        yield b" " * min(piece, size - sent)
        sent += piece


def test_oversized_chunked_body_gets_413(remediator: Served) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    r = requests.post(remediator.url + "/webhook", data=chunked(2_000_000), headers=headers, timeout=10)
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert "too large" in r.json()["error"] and "1048576" in r.json()["error"]
    big = requests.post(remediator.url + "/webhook", data=b" " * 2_000_000, headers=headers, timeout=10)
    assert big.status_code == 413 and "too large" in big.json()["error"]
    # a chunked body within the limit is served as before
    body = json.dumps(payload(alert("gpu-a", alertname="LLMHighErrorRate", restart=False))).encode()
    ok = requests.post(remediator.url + "/webhook", data=iter([body[:10], body[10:]]), headers=headers, timeout=10)
    assert ok.status_code == 202, ok.text
    assert requests.get(remediator.url + "/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("runtime_dir", [False, True], ids=["HOME", "XDG_RUNTIME_DIR"])
def test_no_control_socket(tmp_path: Path, runtime_dir: bool) -> None:
    with serving(tmp_path, "--workers", 1, runtime_dir=runtime_dir) as s:
        # gunicorn starts its control socket after the first workers, just before its main loop; a SIGHUP
        # is handled in that loop ("Hang up"), so once it is logged the socket would exist
        os.kill(s.proc.pid, signal.SIGHUP)
        wait_until(lambda: "Hang up" in s.proc.log(), timeout=20, what="the master in its main loop")
        assert list(s.home.rglob("*")) == [] and list(s.runtime.rglob("*")) == []   # no gunicorn.ctl, no .gunicorn/
        assert "control socket" not in s.proc.log().lower()
        s.proc.wait_http(s.url + "/healthz", timeout=30)


# -- the worker that holds the authority --------------------------------------------------------------
def healthz_fresh(url: str) -> tuple[float, dict[str, Any]]:
    """/healthz on a new connection (the worker that accepts it answers), and how long it took."""
    start = time.monotonic()
    answer = requests.get(url + "/healthz", headers={"Connection": "close"}, timeout=10).json()
    return time.monotonic() - start, answer


def test_the_authoritys_worker_leaves_new_connections_to_the_other_worker(tmp_path: Path) -> None:
    """serving.py: its threads verify, claim and restart; a storm's webhooks served there queued behind them.
    It takes a connection only once it has waited YIELD_FOR for the other worker (busy, or here stopped),
    and closes it after the answer, so that a kept-alive client goes back to the other."""
    with serving(tmp_path) as s:                          # the default: 2 workers
        wait_until(lambda: "llm_health_remediator_lease_holder_info{" in requests.get(s.url + "/metrics",
                                                                                      timeout=10).text,
                   timeout=30, what="a worker holding the authority")
        with ThreadPoolExecutor(2) as pool:              # 20 bursts of 2 fresh connections at once
            answers = [a for _ in range(20) for a in pool.map(lambda _: healthz_fresh(s.url), range(2))]
        # without the yield the holder took 13 or 14 of them at once, each in 3 to 8 ms; with it, one only
        # when the other worker was slower than YIELD_FOR to take it (a loaded machine), and then not early
        early = [round(t * 1000, 1) for t, a in answers if a["holds_lease"] and t < YIELD_FOR / 2]
        assert len(early) <= 3, f"the authority's worker took fresh connections after {early} ms"
        other = next(int(a["worker"]) for _, a in answers if not a["holds_lease"])
        os.kill(other, signal.SIGSTOP)
        kept = connect(s.port)
        try:
            kept.sendall(get("/healthz"))                 # the other worker cannot take it: the authority's does
            answer = read_until(kept, closed)             # ... and closes it after the answer
        finally:
            os.kill(other, signal.SIGCONT)
            kept.close()
        doc = json.loads(split_responses(answer)[0][1])
        assert doc["holds_lease"] is True and int(doc["worker"]) != other
        assert b"connection: close" in answer.lower()


# -- the worker's limits and normal clients, with small limits -------------------------------------
TIGHT = {"request_timeout": 2, "idle_timeout": 1, "max_header_bytes": 2048, "max_body_bytes": 65536,
         "max_pending_connections": 8, "max_pending_per_peer": 3, "threads": 2}


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("slow-clients-tight"), "--workers", 1, **TIGHT) as s:
        yield s


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def read_until(sock: socket.socket, done: Callable[[bytes], bool], timeout: float = 10.0) -> bytes:
    """What the server sent until `done(received)` or it closed (a deadline, never a fixed wait)."""
    data = b""
    end = time.monotonic() + timeout
    while not done(data) and time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            part = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not part:
            break
        data += part
    return data


def closed(data: bytes) -> bool:
    return False      # read until the server closes


def responses(n: int) -> Callable[[bytes], bool]:
    """Done once `n` complete responses (each with a Content-Length body) have arrived."""
    def done(data: bytes) -> bool:
        return len(split_responses(data)) >= n
    return done


def split_responses(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while b"\r\n\r\n" in data:
        head, rest = data.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if len(rest) < length:
            break
        out.append((status, rest[:length]))
        data = rest[length:]
    return out


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def post(body: bytes, extra: str = "", chunked: bool = False) -> bytes:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = (f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n{extra}\r\n").encode()
    return head + body


def webhook_body(i: int) -> bytes:
    return json.dumps(payload(alert("gpu-a", alertname="LLMHighErrorRate", restart=False,
                                    starts_at=f"2026-11-30T01:{i:02d}:00Z"))).encode()


def test_keep_alive_and_pipelining_as_before(tight: Served) -> None:
    with connect(tight.port) as s:
        for i in range(3):                                      # one connection, one request after another
            s.sendall(get("/healthz"))
            assert [st for st, _ in split_responses(read_until(s, responses(1)))] == [200], i
        s.sendall(get("/healthz") + post(webhook_body(1)) + get("/api/backends"))   # three at once
        answers = split_responses(read_until(s, responses(3)))
        assert [st for st, _ in answers] == [200, 202, 200]
        assert json.loads(answers[2][1])["backends"][0]["backend"] == "gpu-a"


def test_chunked_body_with_trailer_and_expect_100_continue(tight: Served) -> None:
    body = webhook_body(2)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:7], body[7:])) + b"0\r\nX-Trailer: 1\r\n\r\n"
    with connect(tight.port) as s:
        s.sendall(post(chunks, chunked=True))
        assert [st for st, _ in split_responses(read_until(s, responses(1)))] == [202]
    with connect(tight.port) as s:                              # the client waits for 100 before its body
        s.sendall(post(body, extra="Expect: 100-continue\r\n")[:-len(body)])
        assert read_until(s, lambda d: d.endswith(b"\r\n\r\n")) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        answer = read_until(s, responses(1))
        assert [st for st, _ in split_responses(answer)] == [202] and b"100 Continue" not in answer


def test_gunicorn_still_validates_requests(tight: Served) -> None:
    bad = [b"GET /healthz HTTP/1.1\nHost: x\n\n",                                     # bare LF
           b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
           b"POST /webhook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",   # bad chunk size
           b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"]
    for request in bad:
        with connect(tight.port) as s:
            s.sendall(request)
            answer = read_until(s, closed)
        assert answer.startswith(b"HTTP/1.1 400 "), (request, answer[:200])


def error_of(answer: bytes) -> tuple[int, str]:
    ((status, body),) = split_responses(answer)
    return status, json.loads(body)["error"]


def test_request_timeout_idle_timeout_and_size_limits(tight: Served) -> None:
    with connect(tight.port) as slow, connect(tight.port) as silent:
        slow.sendall(b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\n")           # and never more
        status, error = error_of(read_until(slow, closed))
        assert status == 408 and "remediator.request_timeout" in error
        assert read_until(silent, closed) == b""                # closed without an answer after idle_timeout
    with connect(tight.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n")
        status, error = error_of(read_until(s, closed))
        assert status == 431 and "max_header_bytes" in error
    with connect(tight.port) as s:
        s.sendall(post(b"", chunked=True) + b"10001\r\n" + b" " * 65537)
        assert error_of(read_until(s, closed)) == (413, "body too large: more than 65536 bytes")
    with connect(tight.port) as s:                              # never read: 413 right after the head
        s.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n")
        assert error_of(read_until(s, closed)) == (413, "body too large: 70000 bytes > 65536")


def test_per_peer_cap_answers_503_and_spares_other_peers(tight: Served) -> None:
    held = [connect(tight.port, "127.0.0.5") for _ in range(3)]
    try:
        for s in held:
            s.sendall(b"G")                                     # started, incomplete
        wait_until(lambda: _answer_to_new(tight.port, "127.0.0.5")[0] == 503, timeout=5,
                   what="503 for a 4th incomplete request from 127.0.0.5")
        status, error = _answer_to_new(tight.port, "127.0.0.5")
        assert "max_pending_per_peer" in error
        assert requests.get(tight.url + "/healthz", timeout=5).status_code == 200     # another peer: served
    finally:
        for s in held:
            s.close()


def _answer_to_new(port: int, source: str) -> tuple[int, str]:
    """What a new connection from `source` that sends nothing is told (0, "" when closed silently)."""
    with connect(port, source) as s:
        answer = read_until(s, closed, timeout=5)
    return error_of(answer) if answer else (0, "")


def test_global_cap_stops_accepting_until_a_slot_frees(tight: Served) -> None:
    """8 incomplete requests (from 4 peers, under their cap of 3): the worker stops accepting; a
    /healthz waits in the backlog and is served once idle_timeout has closed the silent ones."""
    held = [connect(tight.port, f"127.0.0.{20 + i % 4}") for i in range(8)]
    try:
        wait_until(lambda: "not accepting" in tight.proc.log(), timeout=10, what="the worker at its cap")
        assert requests.get(tight.url + "/healthz", timeout=10).status_code == 200
        assert all(read_until(s, closed, timeout=5) == b"" for s in held)     # idle: closed silently
    finally:
        for s in held:
            s.close()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[str, ManagedProcess]]:
    """A real remediator with two workers and a request_timeout of 2 s: (its URL, its process)."""
    with running(tmp_path, 2, request_timeout=2) as served:
        yield served


def test_f5_dripping_clients_do_not_starve_the_webhook(two_workers: tuple[str, ManagedProcess]) -> None:
    url, _ = two_workers
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()
    cut: list[float] = []

    def drip() -> None:
        while not stop.is_set():                       # a malicious client: reconnects when cut off
            start = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                    while not stop.is_set():
                        s.sendall(b"X")
                        s.settimeout(0.3)
                        try:
                            if s.recv(1) == b"":
                                break
                        except TimeoutError:
                            continue
            except OSError:
                pass
            cut.append(time.monotonic() - start)

    threads = [threading.Thread(target=drip, daemon=True) for _ in range(12)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)  # let every dripper get a thread (not a wait for a result: the checks below poll)
        for i in range(6):
            h = requests.get(url + "/healthz", timeout=1.0)
            assert h.status_code == 200
            body = payload(alert(backend="unknown", starts_at=f"2026-11-30T00:0{i}:00Z"))
            r = requests.post(url + "/webhook", json=body, headers=AUTH, timeout=1.0)
            assert r.status_code == 202
        wait_until(lambda: len(cut) >= 1, timeout=10, what="a dripping connection cut off by request_timeout")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
