"""End to end on loopback: simulated vLLM -> real Prometheus with the rendered rules -> real
Alertmanager with the example config -> a webhook receiver standing in for the remediator.

One simulator is busy (requests in flight, tokens flowing), one is stalled (requests in flight, the
engine frozen). Only the stalled one may reach the webhook, as LLMBackendStalled with
remediation="restart", with the bearer token read from the credentials file.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.httpserver import QuietHandler
from llm_health.render.rules import RuleSettings, write_rendered
from tests.support.loopback import Loopback
from tests.support.promtool import REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")),
        reason="prometheus / prometheus-alertmanager not installed (make debs)",
    ),
]

TOKEN = "e2e-s3cret-token"


class Receiver:
    """Records every POST: (path, headers, JSON body)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        received = self.received

        class Handler(QuietHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.end_headers()

        self.loop = Loopback(Handler)
        self.port = self.loop.port

    def alerts(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [(headers, alert) for _, headers, body in self.received for alert in body["alerts"]]

    def close(self) -> None:
        self.loop.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def start_load(url: str, n: int) -> None:
    """n long completions in flight (daemon threads; they end when the simulator stops)."""

    def one() -> None:
        try:
            requests.post(f"{url}/v1/completions", json={"model": "sim-model", "prompt": "hello", "max_tokens": 5000},
                          timeout=120)
        except requests.RequestException:
            pass

    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()


def in_flight(url: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=2).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_stalled_backend_reaches_the_remediator_webhook_and_busy_one_does_not(tmp_path: Path, receiver: Receiver) -> None:
    procs: list[ManagedProcess] = []
    try:
        ports = {name: free_port() for name in ("busy", "stuck", "prom", "am")}
        sims = {}
        for name in ("busy", "stuck"):
            sim = ManagedProcess(llm_health("sim", "--port", ports[name]), f"sim-{name}", tmp_path)
            procs.append(sim)
            sims[name] = f"http://127.0.0.1:{ports[name]}"
        for name, url in sims.items():
            procs[list(sims).index(name)].wait_http(f"{url}/v1/models")
        start_load(sims["busy"], 4)
        start_load(sims["stuck"], 3)
        wait_until(lambda: in_flight(sims["busy"]) >= 4 and in_flight(sims["stuck"]) >= 3, timeout=20,
                   what="requests in flight on both simulators")
        # Wedge the engine with work in flight (its gauges freeze with it, as vLLM's do).
        requests.post(f"{sims['stuck']}/sim/fault", json={"fault": "stall"}, timeout=5).raise_for_status()

        rules_dir = tmp_path / "rules"
        write_rendered(rules_dir, RuleSettings(scrape_interval="1s", stall_window="5s", stall_for="2s", down_for="10s",
                                               restart_window="10s", rate_window="5s", probe_busy_window="10s",
                                               proxy_window="30s"))

        # The example Alertmanager config, pointed at our receiver, with test-sized timings.
        am_cfg = yaml.safe_load((REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
        am_cfg["route"].update(group_wait="1s", group_interval="2s")
        for route in am_cfg["route"]["routes"]:
            route.update(group_wait="1s", group_interval="2s")
        hook = next(r for r in am_cfg["receivers"] if r["name"] == "llm-health-remediator")["webhook_configs"][0]
        hook["url"] = f"http://127.0.0.1:{receiver.port}/webhook"
        am_dir = tmp_path / "am"
        am_dir.mkdir()
        (am_dir / hook["http_config"]["authorization"]["credentials_file"]).write_text(TOKEN + "\n")
        (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(am_cfg))
        am = ManagedProcess(
            ["prometheus-alertmanager", f"--config.file={am_dir / 'alertmanager.yml'}", f"--storage.path={am_dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{ports['am']}", "--cluster.listen-address="],
            "alertmanager", tmp_path,
        )
        procs.append(am)
        am.wait_http(f"http://127.0.0.1:{ports['am']}/-/ready")

        prom_cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_dir / "*.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['am']}"]}]}]},
            "scrape_configs": [{
                "job_name": "vllm",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{ports[name]}"], "labels": {"backend": name}} for name in ("busy", "stuck")
                ],
            }],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        prom = ManagedProcess(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{ports['prom']}", "--log.level=warn"],
            "prometheus", tmp_path,
        )
        procs.append(prom)
        prom.wait_http(f"http://127.0.0.1:{ports['prom']}/-/ready")

        def stalled_alert() -> tuple[dict[str, str], dict[str, Any]] | None:
            for headers, alert in receiver.alerts():
                if alert["labels"].get("alertname") == "LLMBackendStalled" and alert["status"] == "firing":
                    return headers, alert
            return None

        headers, alert = wait_until(stalled_alert, timeout=60, interval=0.2, what="LLMBackendStalled at the webhook")
        assert alert["labels"]["backend"] == "stuck"
        assert alert["labels"]["remediation"] == "restart"
        assert alert["annotations"]["runbook_url"].endswith("#llmbackendstalled")
        assert headers.get("Authorization") == f"Bearer {TOKEN}"
        # Only restart-worthy alerts are routed to the remediator, and never for the busy backend.
        for _, other in receiver.alerts():
            assert other["labels"].get("remediation") == "restart", other["labels"]
            assert other["labels"].get("backend") != "busy", other["labels"]
        # The rules' state agrees: busy is busy (2), stuck is stalled (5).
        result = requests.get(f"http://127.0.0.1:{ports['prom']}/api/v1/query",
                              params={"query": "backend:llm_health_state:code"}, timeout=5).json()
        states = {r["metric"]["backend"]: float(r["value"][1]) for r in result["data"]["result"]}
        assert states == {"busy": 2.0, "stuck": 5.0}
    finally:
        for proc in reversed(procs):
            proc.stop()
