"""A real Alertmanager 0.25 with the example config delivers the Watchdog to a real remediator: the remediator
stamps it (last webhook and last Watchdog times on /metrics), opens nothing, audits nothing; the Watchdog
goes to the remediator and the dead man's switch receiver, never to the people's receiver."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import free_port, wait_until
from tests.support.alertmanager import AM_BINARY, running_alertmanager
from tests.support.paths import REPO
from tests.support.remediator_process import Remediator

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(AM_BINARY is None, reason="prometheus-alertmanager not installed")]
STAMPS = ("llm_health_remediator_last_webhook_timestamp_seconds",
          "llm_health_remediator_last_watchdog_timestamp_seconds")


def stamps(r: Remediator) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(r.get("/metrics").text) for s in f.samples
            if s.name in STAMPS}


def test_alertmanager_delivers_the_watchdog_to_the_remediator(tmp_path: Path) -> None:
    assert AM_BINARY is not None
    r = Remediator(tmp_path, {"backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}",
                                            "restart": ["true"]}]})
    config = yaml.safe_load((REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs") or []:
            hook["url"] = f"{r.url}/webhook"
            hook["http_config"]["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        r.wait_ready()
        with running_alertmanager(tmp_path / "alertmanager.yml", tmp_path) as am_url:
            assert stamps(r) == dict.fromkeys(STAMPS, 0.0)
            posted = requests.post(f"{am_url}/api/v2/alerts", timeout=5, json=[
                {"labels": {"alertname": "LLMHealthWatchdog", "severity": "none"},
                 "annotations": {"summary": "Always firing"}}])
            assert posted.status_code == 200, posted.text
            heard = wait_until(lambda: all((s := stamps(r)).values()) and s, timeout=30,
                               what="the Watchdog at the remediator")
            assert heard[STAMPS[0]] == heard[STAMPS[1]]
            alerts = requests.get(f"{am_url}/api/v2/alerts", timeout=5).json()
            (watchdog,) = [a for a in alerts if a["labels"]["alertname"] == "LLMHealthWatchdog"]
            assert sorted(x["name"] for x in watchdog["receivers"]) == ["llm-health-remediator", "watchdog"]
            kinds = {e["kind"] for e in r.get("/api/events").json()["events"]}   # the authority's own (its lease)
            assert not kinds & {"received", "ignored", "signal", "incident_opened", "deduplicated"}, kinds
            assert 'llm_health_remediator_alerts_received_total{status="firing"} 1.0' in r.get("/metrics").text
    finally:
        r.stop()
