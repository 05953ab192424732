"""The exporter and `llm-health check` as processes on the faults reviewers found: a rejected probe
(the API key), a hung server (`unresponsive`), slow /metrics on an idle server. Simulator processes
where the simulator has the fault, `FakeVllm` (tests/support/fakevllm.py) where it has not."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.exporter.check import verify
from tests.support.fakevllm import KEY, KW


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
