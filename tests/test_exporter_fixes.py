"""Reviewer findings: rejected probes, stale reads, per-engine verify, probes counted when sent,
hung servers (`unresponsive`), slow /metrics on an idle server.

`FakeVllm` is a real HTTP server on 127.0.0.1 whose page, pace and API key the test controls
(vLLM V1 page format; `/v1/*` protected by the key as vLLM's `--api-key` does, `/metrics` and
`/health` not). Simulator processes are used where the simulator has the fault already.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import requests
from llm_health.exporter.check import verify
from llm_health.exporter.observation import Observation, ProbeResult, ReadResult
from llm_health.exporter.reading import read_text
from llm_health.exporter.scheduler import ReadScheduler
from llm_health.exporter.verdict import Thresholds, Verdict, judge
from loopback import Loopback

from llm_health.config import Backend, ExporterSettings
from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until

KEY = "s3cret-key"
KW = {"readings": 2, "interval": 0.2, "read_timeout": 0.5, "probe_timeout": 2.0}


class FakeVllm:
    """A vLLM-shaped server: /metrics (V1 page from `engines`), /health, /v1/models, /v1/completions."""

    def __init__(self, api_key: str = "") -> None:
        self.api_key = api_key
        self.engines: dict[str, dict[str, float]] = {"0": {"running": 0, "waiting": 0, "gen": 100}}
        self.lock = threading.Lock()
        self.drip = False                 # /metrics: headers at once, then the body a byte at a time...
        self.release = threading.Event()  # ...until this is set
        self.hold_completions = threading.Event()  # set: /v1/completions waits until it is cleared
        self.probes = 0
        self.probes_while_busy = 0
        self.auth: dict[str, list[bool]] = {}  # path -> Authorization header present, per request
        self.metrics_done = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                path = self.path.split("?", 1)[0]
                header = self.headers.get("Authorization")
                with fake.lock:
                    fake.auth.setdefault(path, []).append(header is not None)
                if not path.startswith("/v1/") or not fake.api_key:
                    return True
                if header != f"Bearer {fake.api_key}":
                    self._send(401, b'{"error": "Unauthorized"}')
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._metrics()
                elif path == "/health":
                    self._send(200, b"")
                elif path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if not self._authorized():
                    return
                if self.headers.get("X-LLM-Health-Probe") == "1":
                    with fake.lock:
                        fake.probes += 1
                        if fake.work() > 0:
                            fake.probes_while_busy += 1
                while fake.hold_completions.is_set():
                    time.sleep(0.01)
                self._send(200, json.dumps({"choices": [{"text": "!"}]}).encode())

            def _metrics(self) -> None:
                body = fake.page().encode()
                if not fake.drip:
                    self._send(200, body, "text/plain; version=0.0.4")
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    i = 0
                    while not fake.release.wait(0.1) and i < len(body) - 1:
                        self.wfile.write(body[i:i + 1])  # a byte now and then keeps the socket alive
                        self.wfile.flush()
                        i += 1
                    self.wfile.write(body[i:])
                    self.wfile.flush()
                with fake.lock:
                    fake.metrics_done += 1

        self.loop = Loopback(Handler, poll_interval=0.05)
        self.url = self.loop.url

    def set(self, engine: str, running: float = 0, waiting: float = 0, gen: float | None = None) -> None:
        with self.lock:
            e = self.engines.setdefault(engine, {"running": 0, "waiting": 0, "gen": 0})
            e.update(running=running, waiting=waiting)
            if gen is not None:
                e["gen"] = gen

    def work(self) -> float:
        return sum(e["running"] + e["waiting"] for e in self.engines.values())

    def page(self) -> str:
        with self.lock:
            engines = {k: dict(v) for k, v in self.engines.items()}
        return vllm_page(engines)

    def stop(self) -> None:
        self.release.set()
        self.hold_completions.clear()
        self.loop.stop()


def vllm_page(engines: dict[str, dict[str, float]]) -> str:
    """A vLLM V1 page: running, waiting, generation tokens per engine, and a start time."""
    lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{k}",model_name="m"}} {v["running"]}'
              for k, v in engines.items()]
    lines += ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [f'vllm:num_requests_waiting{{engine="{k}",model_name="m"}} {v["waiting"]}'
              for k, v in engines.items()]
    lines += ["# TYPE vllm:generation_tokens_total counter"]
    lines += [f'vllm:generation_tokens_total{{engine="{k}",model_name="m"}} {v["gen"]}'
              for k, v in engines.items()]
    lines += ["# TYPE process_start_time_seconds gauge", "process_start_time_seconds 1000.0", ""]
    return "\n".join(lines)


@pytest.fixture
def fake() -> Iterator[Callable[..., FakeVllm]]:
    started: list[FakeVllm] = []

    def start(api_key: str = "") -> FakeVllm:
        f = FakeVllm(api_key)
        started.append(f)
        return f

    yield start
    for f in started:
        f.stop()


def sim(launch: Callable[..., ManagedProcess], *extra: Any) -> tuple[str, str]:
    port, control = free_port(), free_port()
    proc = launch(llm_health("sim", "--port", port, "--control-port", control, *extra), f"sim{port}")
    url, ctl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control}"
    proc.wait_http(ctl + "/sim/stats")
    proc.wait_http(url + "/v1/models")
    return url, ctl


def fault(ctl: str, name: str, seconds: float | None = None) -> None:
    body: dict[str, Any] = {"fault": name}
    if seconds is not None:
        body["seconds"] = seconds
    assert requests.post(ctl + "/sim/fault", json=body, timeout=5).status_code == 200


def exporter(launch: Callable[..., ManagedProcess], backends: dict[str, str], *extra: Any) -> str:
    port = free_port()
    argv: list[Any] = ["exporter", "--listen", f"127.0.0.1:{port}", "--interval", 0.3, "--stall-after", 2,
                       "--read-timeout", 0.5, "--probe-timeout", 2]
    for name, url in backends.items():
        argv += ["--backend", f"{name}={url}"]
    proc = launch(llm_health(*argv, *extra), f"exporter{port}")
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health")
    return base


def backend(base: str, name: str) -> dict[str, Any]:
    return next(b for b in requests.get(base + "/verdicts", timeout=5).json()["backends"] if b["backend"] == name)


def watch(base: str, name: str, until: Callable[[dict[str, Any]], bool], timeout: float) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def done() -> bool:
        seen.append(backend(base, name))
        return until(seen[-1])

    wait_until(done, timeout=timeout, interval=0.03, what=f"{name} condition")
    return seen


# ------------------------------------------------------------------------------------ 1. rejected probes


def test_a_rejected_probe_is_unknown_and_never_counts_toward_down() -> None:
    idle = read_text(vllm_page({"0": {"running": 0, "waiting": 0, "gen": 100}}))
    t = Thresholds(stall_after=120.0, down_after=2)
    rejected = ProbeResult("error", "HTTP 401", 0.01, status=401)
    state = None
    verdicts = []
    for now, probe in enumerate([None, rejected, None, rejected, rejected, None]):
        state = judge(state, Observation(ReadResult.OK, idle, probe=probe), float(now), t)
        verdicts.append(state.verdict)
    assert verdicts == [Verdict.IDLE] + [Verdict.UNKNOWN] * 5
    assert "probe rejected: HTTP 401 — set exporter.api_key_file?" in state.reason
    state = judge(state, Observation(ReadResult.OK, idle, probe=ProbeResult("ok", seconds=0.1)), 6.0, t)
    assert state.verdict == Verdict.IDLE and "rejected" not in state.reason
    # a server error still counts: 5xx twice is down
    for now in (7.0, 8.0):
        state = judge(state, Observation(ReadResult.OK, idle, probe=ProbeResult("error", "HTTP 503", status=503)), now, t)
    assert state.verdict == Verdict.DOWN
    wrong_model = ProbeResult("error", "HTTP 404", status=404)
    state = judge(state, Observation(ReadResult.OK, idle, probe=wrong_model), 9.0, t)
    assert state.verdict == Verdict.UNKNOWN and "probe_model" in state.reason


def test_verify_and_check_with_an_api_key(fake, tmp_path: Path) -> None:
    f = fake(api_key=KEY)
    v = verify(f.url, **KW)  # the model comes from /v1/models, which rejects us already
    assert v.outcome == "unknown", v
    assert "probe rejected: /v1/models: HTTP 401 — set exporter.api_key_file?" in v.reason
    v = verify(f.url, **KW, model="m")  # the completion itself is rejected
    assert v.outcome == "unknown", v
    assert "probe rejected: HTTP 401 — set exporter.api_key_file?" in v.reason
    v = verify(f.url, **KW, api_key=KEY)
    assert v.outcome == "idle_ok", v
    assert f.probes == 1  # the rejected one never reached the model; the authorized one did
    # /metrics and /health stay unauthenticated; /v1/* carried the key
    assert f.auth["/metrics"] and not any(f.auth["/metrics"])
    assert any(f.auth["/v1/completions"])

    keyfile = tmp_path / "key"
    keyfile.write_text(KEY + "\n")
    ok = subprocess.run(llm_health("check", f.url, "--interval", 0.2, "--timeout", 0.5, "--api-key-file", keyfile),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: idle"), ok.stdout + ok.stderr
    bad = subprocess.run(llm_health("check", f.url, "--interval", 0.2, "--timeout", 0.5),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "probe rejected: /v1/models: HTTP 401" in bad.stdout, bad.stdout + bad.stderr
    missing = subprocess.run(llm_health("check", f.url, "--api-key-file", tmp_path / "nope"),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--api-key-file" in missing.stderr


def test_exporter_with_and_without_the_api_key(fake, launch, tmp_path: Path) -> None:
    f = fake(api_key=KEY)
    (tmp_path / "key").write_text(KEY + "\n")
    cfg = tmp_path / "llm-health.yml"
    cfg.write_text(f"backends:\n  - name: keyed\n    url: {f.url}\nexporter:\n  api_key_file: key\n")
    with_key = exporter(launch, {}, "--config", cfg)  # relative to the config file's folder
    without = exporter(launch, {"plain": f.url})
    wait_until(lambda: "probe answered" in backend(with_key, "keyed")["reason"], timeout=10, what="probe answered")
    seen = watch(without, "plain", lambda b: b["probes"]["error"] >= 3, timeout=15)
    verdicts = {b["verdict"] for b in seen}
    assert "down" not in verdicts and "unknown" in verdicts, verdicts
    assert "HTTP 401 — set exporter.api_key_file?" in seen[-1]["reason"]
    assert "probe rejected" in seen[-1]["reason"]
    assert seen[-1]["verdict"] == "unknown"
    assert not any(f.auth["/metrics"]) and not any(f.auth.get("/health", []))


# ------------------------------------------------------------------------------------ 2. stale reads


def test_a_read_finishing_after_the_cycle_gave_up_is_never_used_later(fake) -> None:
    """The reviewer's case: an idle page that arrives late must not allow a probe of a busy server."""
    f = fake()
    f.drip = True
    fleet = ReadScheduler([Backend(name="a", url=f.url)], [],
                  ExporterSettings(interval=0.3, read_timeout=1.0, probe_timeout=2.0))
    try:
        slot = fleet.backends[0]
        fleet.read_all(due=0.0)  # the idle page is still dripping at the read's deadline
        # the exchange ended by its own total deadline: the dripped page is never read, late or not
        assert slot.read is None or slot.read.done()
        assert slot.readings["timeout"] == 1 and slot.probes_sent == 0
        f.release.set()
        f.drip = False
        f.set("0", running=2, gen=150)  # busy by the next cycle
        before = f.metrics_done
        fleet.read_all(due=1.0)
        assert f.metrics_done >= before + 1  # a new read was made (the dripped one may have ended too)
        assert slot.readings["ok"] == 1 and slot.readings["timeout"] == 1  # ...and the late one not counted
        assert slot.state.in_flight == 2 and slot.state.verdict != Verdict.IDLE
        assert slot.probes_sent == 0 and slot.probe is None
        assert f.probes == 0 and f.probes_while_busy == 0
        # the server is idle again: a fresh idle reading may probe
        f.set("0", running=0, gen=160)
        fleet.read_all(due=2.0)
        assert slot.probes_sent == 1
        wait_until(lambda: f.probes == 1, timeout=5, what="probe arrives")
        assert f.probes_while_busy == 0
    finally:
        f.release.set()
        fleet.close()


# ------------------------------------------------------------------------------------ 3. per-engine verify


def test_verify_judges_every_engine_like_the_exporter(fake) -> None:
    f = fake()
    f.set("0", running=2, gen=100)
    f.set("1", running=3, gen=500)

    def step(gen0: float, gen1: float, running1: float = 3) -> Callable[[float], None]:
        return lambda _s: (f.set("0", running=2, gen=gen0), f.set("1", running=running1, gen=gen1))

    # engine 0 moves, engine 1 (with work) is frozen: no_progress, and the reason names engine 1
    v = verify(f.url, **{**KW, "sleep": step(180, 500)})
    assert v.outcome == "no_progress", v
    assert v.reason.startswith("engine 1: 3 running"), v
    # both move: progress
    f.set("1", running=3, gen=500)
    v = verify(f.url, **{**KW, "sleep": step(260, 600)})
    assert v.outcome == "progress" and v.in_flight == 5, v
    # an engine without work may be quiet
    f.set("1", running=0, gen=600)
    v = verify(f.url, **{**KW, "sleep": step(340, 600, running1=0)})
    assert v.outcome == "progress" and v.in_flight == 2, v
    # engine 1 got work between the readings and has not moved yet: cannot tell
    v = verify(f.url, **{**KW, "sleep": step(420, 600, running1=1)})
    assert v.outcome == "unknown" and "engine 1" in v.reason, v
    assert f.probes == 0


# ------------------------------------------------------------------------------------ 4. probes counted when sent


def test_probes_are_counted_when_sent(fake) -> None:
    from llm_health.exporter.collector import ExporterCollector
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    f = fake()
    f.hold_completions.set()  # the probe is sent but not answered yet
    fleet = ReadScheduler([Backend(name="a", url=f.url)], [],
                  ExporterSettings(interval=0.3, read_timeout=1.0, probe_timeout=5.0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(fleet.snapshot))
    try:
        fleet.read_all(due=0.0)
        wait_until(lambda: f.probes == 1, timeout=5, what="probe sent")
        text = generate_latest(registry).decode()
        assert 'llm_health_probes_sent_total{backend="a"} 1.0' in text
        for result in ("ok", "error", "timeout"):
            assert f'llm_health_probes_total{{backend="a",result="{result}"}} 0.0' in text
        f.hold_completions.clear()
        slot = fleet.backends[0]
        wait_until(slot.probe.done, timeout=5, what="probe answered")
        fleet.read_all(due=0.1)  # too soon for another probe; the answer is counted
        text = generate_latest(registry).decode()
        assert 'llm_health_probes_sent_total{backend="a"} 1.0' in text
        assert 'llm_health_probes_total{backend="a",result="ok"} 1.0' in text
    finally:
        f.hold_completions.clear()
        fleet.close()


# ------------------------------------------------------------------------------------ 5. unresponsive, 7. slow


def test_a_timeout_after_an_idle_reading_counts_only_when_health_fails_too() -> None:
    t = Thresholds(stall_after=120.0, down_after=2)
    idle = Observation(ReadResult.OK, read_text(vllm_page({"0": {"running": 0, "waiting": 0, "gen": 100}})))
    slow = Observation(ReadResult.TIMEOUT, detail="no answer within 5 s", cheap_ok=True)
    dead = Observation(ReadResult.TIMEOUT, detail="no answer within 5 s", cheap_ok=False)
    states = []
    state = None
    for now, obs in enumerate([idle, slow, slow, slow, slow, dead, dead]):
        state = judge(state, obs, float(now), t)
        states.append(state)
    assert [s.verdict for s in states] == [Verdict.IDLE] + [Verdict.UNKNOWN] * 5 + [Verdict.DOWN]
    assert states[1].reason == "/metrics slow, /health fine" and states[4].failures == 0
    assert "/health failed too" in states[-1].reason
    # while the last reading had work a timeout is judged as before (toward stalled, never down)
    busy = Observation(ReadResult.OK, read_text(vllm_page({"0": {"running": 3, "waiting": 0, "gen": 100}})))
    state = judge(judge(None, busy, 0.0, t), slow, 15.0, t)
    assert state.verdict == Verdict.UNKNOWN and "last reading 3 running" in state.reason


def test_a_hung_server_is_unresponsive_a_slow_metrics_page_is_unknown(launch) -> None:
    url, ctl = sim(launch)
    fault(ctl, "slow_metrics", 1.5)
    v = verify(url, **KW)
    assert v.outcome == "unknown" and "/health fine" in v.reason, v
    fault(ctl, "hang")
    v = verify(url, **KW)
    assert v.outcome == "unresponsive", v
    assert "timed out (2 of 2)" in v.reason and "/health" in v.reason
    r = subprocess.run(llm_health("check", url, "--interval", 0.2, "--timeout", 0.5),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout.startswith("UNKNOWN: unresponsive"), r.stdout + r.stderr
    fault(ctl, "none")
    assert verify(url, **KW).outcome == "idle_ok"
    assert verify(f"http://127.0.0.1:{free_port()}", **KW).outcome == "down"


def test_slow_metrics_on_an_idle_server_is_not_down_while_health_answers(launch) -> None:
    url, ctl = sim(launch)
    base = exporter(launch, {"a": url})
    wait_until(lambda: backend(base, "a")["verdict"] == "idle", timeout=10, what="idle")
    fault(ctl, "slow_metrics", 1.5)  # three times the read timeout
    seen = watch(base, "a", lambda b: b["verdict"] == "unknown" and "/health fine" in b["reason"], timeout=10)
    target = _cycles(base) + 8  # two down_after windows and then some
    more = watch(base, "a", lambda _b: _cycles(base) >= target, timeout=15)
    verdicts = [b["verdict"] for b in seen + more]
    assert "down" not in verdicts and "stalled" not in verdicts, verdicts
    stats = requests.get(ctl + "/sim/stats", timeout=5).json()
    assert stats["probes_while_busy"] == 0
    fault(ctl, "none")
    wait_until(lambda: backend(base, "a")["verdict"] == "idle", timeout=10, what="idle again")


def _cycles(base: str) -> int:
    return int(requests.get(base + "/verdicts", timeout=5).json()["cycles"])
