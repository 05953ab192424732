"""A real Prometheus (2.42, which asks for OpenMetrics first and for gzip) scrapes a real exporter and a
real remediator: both targets are up and Prometheus stores exactly the series of the text page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from tests.support.remediator_process import Remediator

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (make debs)")]
RUNTIME = ("process_", "python_")      # the scraped process' own series: their values move, their names do not


def page_names(url: str) -> set[str]:
    text = requests.get(url + "/metrics", timeout=5).text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def stored_names(prom: str, job: str) -> set[str]:
    r = requests.get(f"{prom}/api/v1/label/__name__/values", params={"match[]": f'{{job="{job}"}}'}, timeout=5)
    return set(r.json()["data"]) - {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                                    "scrape_samples_post_metric_relabeling", "scrape_series_added"}


def test_prometheus_scrapes_both_in_openmetrics(tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    exporter_port, prom_port = free_port(), free_port()
    exporter = ManagedProcess(llm_health("exporter", "--listen", f"127.0.0.1:{exporter_port}", "--interval", 0.3,
                                         "--read-timeout", 0.5, "--backend", f"gpu-a=http://127.0.0.1:{free_port()}"),
                              "exporter", tmp_path)
    remediator = Remediator(tmp_path, {"backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}",
                                                     "restart": ["true"]}]})
    procs: list[ManagedProcess] = [exporter, remediator.proc]
    try:
        exporter_url = f"http://127.0.0.1:{exporter_port}"
        exporter.wait_http(exporter_url + "/health")
        remediator.wait_ready()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
                {"job_name": "remediator", "static_configs": [{"targets": [f"127.0.0.1:{remediator.port}"]}]},
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = ManagedProcess([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                               "--log.level=warn"], "prometheus", tmp_path)
        procs.append(prom)
        base = f"http://127.0.0.1:{prom_port}"
        prom.wait_http(base + "/-/ready")

        def targets_up() -> bool:
            active = requests.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        wait_until(targets_up, timeout=30, what="both targets up")
        for job, url in (("exporter", exporter_url), ("remediator", remediator.url)):
            expected = {n for n in page_names(url) if not n.startswith(RUNTIME)}
            wait_until(lambda job=job, expected=expected: expected <= stored_names(base, job), timeout=20,
                       what=f"every series of the {job}'s page stored")
            stored = {n for n in stored_names(base, job) if not n.startswith(RUNTIME)}
            assert stored == expected, (job, sorted(stored ^ expected))
            info = requests.get(f"{base}/api/v1/query", params={"query": f'llm_health_build_info{{job="{job}"}}'},
                                timeout=5).json()["data"]["result"]
            assert len(info) == 1 and info[0]["value"][1] == "1", info
    finally:
        for proc in reversed(procs):
            proc.stop()
