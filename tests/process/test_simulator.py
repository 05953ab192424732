"""`llm-health sim` as a real process: CLI, a real Prometheus scraping it, `simulator.ctl` as an action."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, python_module, wait_until


@pytest.fixture
def sim_proc(tmp_path: Path) -> Iterator[tuple[ManagedProcess, str, str]]:
    port, control = free_port(), free_port()
    proc = ManagedProcess(
        llm_health("sim", "--port", port, "--control-port", control, "--step-seconds", 0.05),
        name="sim", log_dir=tmp_path,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/health")
        yield proc, url, f"http://127.0.0.1:{control}"
    finally:
        proc.stop()


def test_help_works() -> None:
    for argv in (llm_health("sim", "--help"), python_module("simulator", "--help"),
                 python_module("llm_health.simulator.ctl", "--help")):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "--" in out.stdout, out.stderr


def test_bad_flags_exit_nonzero(tmp_path: Path) -> None:
    out = subprocess.run(llm_health("sim", "--port", free_port(), "--engine", "v0", "--engines", "2"),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "engine" in out.stderr


def test_prints_url_and_prometheus_scrapes_it(sim_proc: tuple[ManagedProcess, str, str], tmp_path: Path) -> None:
    proc, url, _ = sim_proc
    wait_until(lambda: url in proc.log(), what="start-up line with the URL")
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus binary not installed (make debs)")
    # three long requests keep three slots running while Prometheus scrapes
    for _ in range(3):
        threading.Thread(target=_swallow, args=(url,), daemon=True).start()
    wait_until(lambda: requests.get(url + "/metrics", timeout=2).text.count(
        'vllm:num_requests_running{engine="0",model_name="sim-model"} 3.0') == 1, what="3 running")
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: vllm\n"
        f"    static_configs: [{{targets: ['{url.removeprefix('http://')}'], labels: {{backend: sim}}}}]\n"
    )
    prom = ManagedProcess(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        name="prometheus", log_dir=tmp_path,
    )
    try:
        api = f"http://127.0.0.1:{prom_port}/api/v1/query"

        def running() -> float | None:
            res = requests.get(api, params={"query": 'vllm:num_requests_running{backend="sim"}'}, timeout=2).json()
            result = res["data"]["result"]
            if not result:
                return None
            assert result[0]["metric"]["engine"] == "0" and result[0]["metric"]["model_name"] == "sim-model"
            return float(result[0]["value"][1])

        assert wait_until(lambda: running() == 3, timeout=30, what="Prometheus to see 3 running")
        up = requests.get(api, params={"query": 'up{job="vllm"}'}, timeout=2).json()["data"]["result"]
        assert up[0]["value"][1] == "1"
    finally:
        prom.stop()


def _swallow(url: str) -> None:
    try:
        requests.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 10000}, timeout=120)
    except requests.RequestException:
        pass


def test_ctl_restart_revives_a_crashed_simulator(sim_proc: tuple[ManagedProcess, str, str]) -> None:
    proc, url, control = sim_proc
    start = requests.get(control + "/sim/stats", timeout=5).json()["process_start_time"]
    done = subprocess.run(python_module("llm_health.simulator.ctl", "fault", "crash", control), capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr

    def refused() -> bool:
        try:
            requests.get(url + "/health", timeout=1)
        except requests.ConnectionError:
            return True
        return False

    wait_until(refused, what="main port closed")
    assert proc.alive()
    bad = subprocess.run(python_module("llm_health.simulator.ctl", "fault", "stall", control), capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 1  # 409: the main port is down
    done = subprocess.run(python_module("llm_health.simulator.ctl", "restart", control), capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: requests.get(url + "/health", timeout=1).ok, what="main port back")
    st = requests.get(control + "/sim/stats", timeout=5).json()
    assert st["restarts"] == 1 and st["fault"] == "none" and st["process_start_time"] > start
    stats = subprocess.run(python_module("llm_health.simulator.ctl", "stats", control), capture_output=True, text=True,
                           timeout=30)
    assert stats.returncode == 0 and '"restarts": 1' in stats.stdout
    unreachable = subprocess.run(python_module("llm_health.simulator.ctl", "restart", f"http://127.0.0.1:{free_port()}"),
                                 capture_output=True, text=True, timeout=30)
    assert unreachable.returncode == 1


def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    proc = ManagedProcess([sys.executable, "-m", "simulator", "--port", port], name="sim-main", log_dir=tmp_path)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        proc.stop()
        assert proc.proc.returncode == 0
    finally:
        proc.stop()
