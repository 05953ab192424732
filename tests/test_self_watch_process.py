"""Issue 12 with real processes: the remediator under gunicorn, and a real Prometheus.

* finding 3: `rm state.db` and `kill -9` of one gunicorn worker never give a second store;
* finding 5: a dozen connections dripping their headers do not starve /healthz or /webhook;
* finding 1 end to end: LLMHealthRemediatorDown fires on a real Prometheus when the remediator is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.render.rules import RuleSettings, write_rendered
from tests.support.alerts import alert, payload
from tests.support.remediator_process import AUTH, write_config


@pytest.fixture
def remediator(tmp_path: Path) -> Iterator[tuple[str, ManagedProcess]]:
    port = free_port()
    config = write_config(tmp_path, request_timeout=2)
    proc = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                     "--workers", 2), name="remediator", log_dir=tmp_path)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def test_f3_deleted_state_and_a_killed_worker_never_make_a_second_store(
        tmp_path: Path, remediator: tuple[str, ManagedProcess]) -> None:
    url, proc = remediator
    workers = wait_until(lambda: (w := children(proc.pid)) and len(w) == 2 and w, what="two workers")
    state = tmp_path / "state.db"
    assert state.exists()
    state.unlink()
    os.kill(workers[0], signal.SIGKILL)

    def stopped() -> bool:
        if not proc.alive():
            return True
        try:
            return requests.get(url + "/healthz", timeout=2).status_code == 503
        except requests.RequestException:
            return False

    wait_until(stopped, timeout=30, what="the remediator stopping (dead or unhealthy)")
    # never re-created behind the first store's back; and every answer says why
    assert not state.exists()
    if proc.alive():
        r = requests.post(url + "/webhook", json=payload(alert()), headers=AUTH, timeout=5)
        assert r.status_code == 503 and "deleted" in r.json()["error"]
    log = proc.log()
    assert "deleted" in log or "cannot open state" in log, log[-2000:]
    assert not state.exists()


def test_f5_dripping_clients_do_not_starve_the_webhook(remediator: tuple[str, ManagedProcess]) -> None:
    url, _ = remediator
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


def test_f1_remediator_down_fires_on_a_real_prometheus(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (make debs)")
    rport, pport = free_port(), free_port()
    config = write_config(tmp_path)
    rules = tmp_path / "rules"
    write_rendered(rules, RuleSettings(scrape_interval="1s", remediator_down_for="3s", webhook_window="4s"))
    prom_cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules / "llm_health_self.yml")],
        "scrape_configs": [{"job_name": "llm-health-remediator",
                            "static_configs": [{"targets": [f"127.0.0.1:{rport}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    rem = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{rport}",
                                    "--workers", 1), name="remediator", log_dir=tmp_path)
    prom = ManagedProcess(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}",
                           "--log.level=warn"], "prometheus", tmp_path)
    try:
        rem.wait_http(f"http://127.0.0.1:{rport}/healthz", timeout=30)
        prom.wait_http(f"http://127.0.0.1:{pport}/-/ready")

        def query(q: str) -> list[dict]:
            r = requests.get(f"http://127.0.0.1:{pport}/api/v1/query", params={"query": q}, timeout=5)
            return r.json()["data"]["result"]

        def firing() -> list[dict]:
            alerts = requests.get(f"http://127.0.0.1:{pport}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "LLMHealthRemediatorDown"
                    and a["state"] == "firing"]

        wait_until(lambda: query('up{job="llm-health-remediator"} == 1')
                   and query("llm_health_remediator_healthy == 1"), timeout=30, what="remediator scraped, healthy")
        # alive: silent (the `absent` branch may have fired before the first scrape; it resolves)
        wait_until(lambda: not firing(), timeout=30, interval=0.5, what="no LLMHealthRemediatorDown while alive")
        rem.kill9()
        alerts = wait_until(lambda: [a for a in firing() if a["labels"].get("instance")], timeout=60, interval=0.5,
                            what="LLMHealthRemediatorDown firing for the killed instance")
        assert alerts[0]["labels"]["instance"] == f"127.0.0.1:{rport}"
        assert alerts[0]["labels"]["severity"] == "critical"
    finally:
        rem.stop()
        prom.stop()


def busy_config(tmp: Path) -> Path:
    path = tmp / "busy.yml"
    path.write_text(yaml.safe_dump({"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18001"}],
                                    "remediator": {"busy_dir": "busy"}}))
    return path


def test_f7_busy_wrapper_recreates_a_lost_marker(tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nsys.exit(0)"
    proc = ManagedProcess(llm_health("busy", "--backend", "gpu-a", "--ttl", "0.6", "--config", busy_config(tmp_path),
                                     "--", "python3", "-c", job), name="busy", log_dir=tmp_path)
    try:
        busy = tmp_path / "busy"
        (first,) = wait_until(lambda: list(busy.glob("gpu-a@*")), what="marker file")
        first.unlink()                                             # lost: removed by hand
        wait_until(lambda: list(busy.glob("gpu-a@*")), timeout=10, what="marker re-created")
        assert "re-created" in proc.log()
        go.write_text("")
        assert proc.proc.wait(timeout=10) == 0
    finally:
        proc.stop()


def test_f7_busy_wrapper_stops_loudly_when_the_marker_cannot_come_back(tmp_path: Path) -> None:
    ran_on = tmp_path / "still-running"
    job = f"import time\nwhile True:\n    open({str(ran_on)!r}, 'w').write(str(time.time()))\n    time.sleep(0.05)"
    proc = ManagedProcess(llm_health("busy", "--backend", "gpu-a", "--ttl", "0.6", "--config", busy_config(tmp_path),
                                     "--", "python3", "-c", job), name="busy", log_dir=tmp_path)
    try:
        busy = tmp_path / "busy"
        wait_until(lambda: list(busy.glob("gpu-a@*")) and ran_on.exists(), what="marker file and job running")
        shutil.rmtree(busy)
        busy.write_text("a file where the marker folder was")     # the marker cannot be written again
        assert wait_until(lambda: proc.proc.poll() is not None and [proc.proc.returncode], timeout=15,
                          what="busy wrapper stopping")[0] == 3
        assert "cannot be re-created" in proc.log()
    finally:
        proc.stop()
