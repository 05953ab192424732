"""Issue 18: a hostile or broken backend harms no one (real processes, loopback).

Dripping servers (tests/drip.py) send their answer one byte at a time: a per-read timeout never fires
on them, only a total deadline does. These tests put hundreds of them beside healthy backends and
check that the healthy ones keep their cadence and verdicts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from llm_health.drill.hostile import DripServer
from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.httpserver import QuietHandler
from tests.support.loopback import Loopback


class Healthy:
    """A busy vLLM page whose counters rise on every read; notes when each /metrics read arrives."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.lock = threading.Lock()
        healthy = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/metrics":
                    with healthy.lock:
                        healthy.arrivals.append(time.monotonic())
                        n = len(healthy.arrivals)
                    body = ("# TYPE vllm:num_requests_running gauge\n"
                            'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
                            "# TYPE vllm:num_requests_waiting gauge\n"
                            'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
                            "# TYPE vllm:generation_tokens_total counter\n"
                            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {100 * n}\n'
                            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1000.0\n").encode()
                else:
                    body = b'{"object": "list", "data": [{"id": "m"}]}'
                self.reply(200, body)

        self.server = Loopback(Handler)
        self.url = self.server.url

    def since(self, t: float) -> list[float]:
        with self.lock:
            return [a for a in self.arrivals if a >= t]


@pytest.fixture
def healthy() -> Iterator[Healthy]:
    h = Healthy()
    yield h
    h.server.stop()


@pytest.fixture
def drippers() -> Iterator[Callable[..., DripServer]]:
    made: list[DripServer] = []

    def make(ports: int, mode: str, every: float = 0.5) -> DripServer:
        d = DripServer(ports=ports, mode=mode, every=every)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def _exporter(launch: Callable[..., ManagedProcess], tmp_path: Path, backends: dict[str, str],
              **settings: float) -> str:
    port = free_port()
    lines = ["backends:"] + [f"  - {{name: {n}, url: '{u}'}}" for n, u in backends.items()]
    lines.append("exporter: {" + ", ".join(f"{k}: {v}" for k, v in settings.items()) + "}")
    cfg = tmp_path / "llm-health.yml"
    cfg.write_text("\n".join(lines) + "\n")
    proc = launch(llm_health("exporter", "--config", cfg, "--listen", f"127.0.0.1:{port}"), f"exporter{port}")
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health", timeout=60)
    return base


def _verdicts(base: str) -> dict[str, dict[str, object]]:
    return {b["backend"]: b for b in requests.get(base + "/verdicts", timeout=10).json()["backends"]}


def _metric(base: str, name: str) -> float:
    for line in requests.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on the exporter's page")


def test_300_dripping_backends_never_take_a_healthy_ones_readers(
        launch: Callable[..., ManagedProcess], tmp_path: Path, healthy: Healthy,
        drippers: Callable[..., DripServer]) -> None:
    """The finding: 300 dripping targets held all 256 shared read workers; the one healthy backend got 1
    reading in 100 s, its verdict went stale, and the schedule lag stayed near 0."""
    heads, bodies = drippers(150, "headers"), drippers(150, "body")
    backends = {f"drip-h{i}": u for i, u in enumerate(heads.urls)}
    backends |= {f"drip-b{i}": u for i, u in enumerate(bodies.urls)}
    backends["healthy"] = healthy.url
    interval = 1.0
    base = _exporter(launch, tmp_path, backends, interval=interval, read_timeout=1.0, stall_after=30)
    wait_until(lambda: heads.accepted >= 150 and bodies.accepted >= 150, timeout=60,
               what="every dripper read at least once")
    # a new backend waits in the suspect lane (behind the drippers) for its first reading only
    wait_until(lambda: _verdicts(base)["healthy"]["verdict"] == "busy", timeout=30, what="the healthy one busy")
    t0 = time.monotonic()
    window = 20.0
    seen: list[str] = []
    reasons: list[str] = []
    lags: list[float] = []

    def watched() -> bool:
        lags.append(_metric(base, "llm_health_schedule_lag_seconds"))
        v = _verdicts(base)["healthy"]
        seen.append(str(v["verdict"]))
        reasons.append(f"{v['verdict']}: {v['reason']} (read {v.get('read_seconds')})")
        return time.monotonic() - t0 >= window

    wait_until(watched, timeout=window + 30, interval=0.5, what="the watch window")
    arrivals = healthy.since(t0)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert len(arrivals) >= window / interval * 0.75, f"{len(arrivals)} readings of the healthy backend in {window} s"
    assert max(gaps) < 2.5 * interval, f"the healthy backend's longest reading gap was {max(gaps):.1f} s"
    assert set(seen) == {"busy"}, f"the healthy backend's verdicts in the window: {sorted(set(seen))}: {[r for r in reasons if not r.startswith('busy')][:5]}"
    verdicts = _verdicts(base)
    judged = [n for n, b in verdicts.items() if n.startswith("drip") and b["readings"]["timeout"] > 0]
    assert len(judged) == 300, f"only {len(judged)} of the 300 drippers have a timed-out reading"
    assert all(verdicts[n]["verdict"] in ("unknown", "down") for n in judged)
    # the drippers' lane is short of workers and the lag says so (it stayed near 0 before)
    assert max(lags) > interval / 2, f"schedule lag at most {max(lags):.3f} s while 300 drippers wait for workers"


TOKEN = "hostile-token"


def _remediator(tmp_path: Path, backends: dict[str, str], **settings: object) -> tuple[str, ManagedProcess]:
    (tmp_path / "token").write_text(TOKEN)
    cfg = {
        "backends": [{"name": n, "url": u, "restart": ["true"]} for n, u in backends.items()],
        "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
        "remediator": {"state": "state.db", "token_file": "token", "verify_readings": 2, "verify_interval": 0.5,
                       "poll_interval": 0.2, "warmup_poll": 0.5, "unresponsive_after": 3,
                       "backoff": {"initial": 0, "factor": 2, "cap": 0, "stable_after": 3600}, **settings},
    }
    path = tmp_path / "llm-health.yml"
    import yaml
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", path, "--listen", f"127.0.0.1:{port}",
                                     "--workers", 1), name="remediator", log_dir=tmp_path, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/healthz", timeout=30)
    return base, proc


def _lifecycle(base: str) -> dict[str, str]:
    docs = requests.get(base + "/api/backends", timeout=10).json()["backends"]
    return {d["backend"]: d["lifecycle"]["state"] for d in docs}


def _kinds(base: str, backend: str) -> list[str]:
    events = requests.get(base + "/api/events", params={"backend": backend, "limit": 1000}, timeout=10).json()
    return [e["kind"] for e in events["events"]]


def test_a_dripping_backend_never_holds_the_remediator(tmp_path: Path, healthy: Healthy,
                                                      drippers: Callable[..., DripServer]) -> None:
    """The finding: the one housekeeping thread blocked on a header-dripping backend: a healthy neighbour
    stayed INITIALIZING for over 80 s, an incident on the dripper never got a decision, and its
    warmup_timeout never fired."""
    drip = drippers(1, "headers")
    other = Healthy()
    try:
        base, proc = _remediator(tmp_path, {"drip": drip.urls[0], "n1": healthy.url, "n2": other.url},
                                 warmup_timeout=8)
        try:
            started = time.monotonic()
            wait_until(lambda: {_lifecycle(base)[n] for n in ("n1", "n2")} == {"ready"}, timeout=15,
                       what="both healthy neighbours READY")
            assert time.monotonic() - started < 15
            body = {"version": "4", "status": "firing", "receiver": "llm-health", "groupKey": "{}:{}",
                    "alerts": [{"status": "firing", "labels": {"alertname": "LLMBackendStalled", "backend": "drip",
                                                               "remediation": "restart", "severity": "critical"},
                                "annotations": {}, "startsAt": "2026-12-01T00:00:00Z", "fingerprint": "f1"}]}
            r = requests.post(base + "/webhook", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            assert r.status_code == 202, r.text
            decided = {"deferred_unknown", "restarting", "not_configured"}
            wait_until(lambda: decided & set(_kinds(base, "drip")), timeout=30, what="a decision on the dripper")
            # verified unresponsive for unresponsive_after, restarted (true exits 0), never warm: timed out
            wait_until(lambda: "warmup_timeout" in _kinds(base, "drip") or
                       "never became ready" in str(requests.get(base + "/api/events", params={"backend": "drip"},
                                                                timeout=10).json()),
                       timeout=60, what="the dripper's warm-up timed out")
            assert {_lifecycle(base)[n] for n in ("n1", "n2")} == {"ready"}
        finally:
            proc.stop()
    finally:
        other.server.stop()
