"""The remediator watched like any service: LLMHealthRemediatorDown (the rendered llm_health_self.yml)
fires on a real Prometheus when the remediator is killed, and only then.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.render.rules import RuleSettings, write_rendered
from tests.support.remediator_process import write_config


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
