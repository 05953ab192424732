"""Two clusters' `vllm-0` are two incidents: a real Alertmanager 0.25 shared by two clusters, with the
shipped route (group_by cluster, namespace, backend), delivers every restart alert to both clusters'
remediators (real processes); each opens the incident of its own cluster's alert only and records the
other one as another group's.

The shipped deploy/alertmanager/alertmanager.yml is loaded as it is, except that its remediator receiver
sends to both remediators and the remediator route waits 1 s instead of 10 s before its first notification.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from tests.support.alertmanager import AM_BINARY, running_alertmanager, shipped_config_to

TOKEN = "group-labels-test-token"
CLUSTERS = ("eu-1", "us-2")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(AM_BINARY is None, reason="prometheus-alertmanager not installed (make debs)"),
]


def remediator_config(folder: Path, cluster: str) -> Path:
    folder.mkdir()
    (folder / "token").write_text(TOKEN + "\n")
    cfg = {
        # nothing answers there: the test is about which alerts open incidents, not about the restart
        "backends": [{"name": "vllm-0", "url": f"http://127.0.0.1:{free_port()}", "restart": ["true"]}],
        "remediator": {"state": "state.db", "token_file": "token", "dry_run": True,
                       "group_labels": {"cluster": cluster}, "poll_interval": 0.5},
    }
    path = folder / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def remediators(tmp_path: Path) -> Iterator[dict[str, str]]:
    procs: list[ManagedProcess] = []
    urls: dict[str, str] = {}
    try:
        for cluster in CLUSTERS:
            port = free_port()
            config = remediator_config(tmp_path / cluster, cluster)
            proc = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                             "--workers", 1), name=f"remediator-{cluster}", log_dir=tmp_path,
                                  cwd=tmp_path / cluster)
            procs.append(proc)
            urls[cluster] = f"http://127.0.0.1:{port}"
            proc.wait_http(urls[cluster] + "/healthz", timeout=30)
        yield urls
    finally:
        for proc in procs:
            proc.stop()


def shared_alertmanager_config(tmp_path: Path, remediators: dict[str, str]) -> Path:
    config = shipped_config_to(list(remediators.values()), TOKEN, tmp_path)
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "llm-health-remediator"
                and r["matchers"] == ['remediation="restart"']]
    assert route["group_by"] == ["cluster", "namespace", "backend"]     # as shipped
    route["group_wait"] = "1s"
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def alertmanager(tmp_path: Path, remediators: dict[str, str]) -> Iterator[str]:
    with running_alertmanager(shared_alertmanager_config(tmp_path, remediators), tmp_path) as url:
        yield url


def events(url: str, kind: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{url}/api/events", params={"kind": kind, "backend": "vllm-0"},
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    answer.raise_for_status()
    return list(answer.json()["events"])


def test_two_clusters_vllm_0_are_two_incidents(alertmanager: str, remediators: dict[str, str]) -> None:
    body = [{"labels": {"alertname": "LLMBackendStalled", "severity": "critical", "remediation": "restart",
                        "backend": "vllm-0", "namespace": "llm", "cluster": cluster},
             "annotations": {"summary": "test"}} for cluster in CLUSTERS]
    answer = requests.post(f"{alertmanager}/api/v2/alerts", json=body, timeout=5)
    assert answer.status_code == 200, answer.text

    def heard_both(url: str) -> list[dict[str, Any]] | None:
        seen = events(url, "incident_opened") + events(url, "ignored")
        return seen if len(seen) >= 2 else None

    for cluster, url in remediators.items():
        seen = wait_until(lambda url=url: heard_both(url), timeout=60, interval=0.5,
                          what=f"remediator {cluster} heard both clusters' alerts")
        opened = [e for e in seen if e["kind"] == "incident_opened"]
        ignored = [e for e in seen if e["kind"] == "ignored"]
        (other,) = [c for c in CLUSTERS if c != cluster]
        # two groups, so two notifications: one incident for its own cluster, one record of the other's
        assert [e["detail"]["group"] for e in opened] == [{"cluster": cluster, "namespace": "llm"}], seen
        assert len(ignored) == 1 and f"cluster='{other}': another group's alert" in ignored[0]["reason"], seen
        answer = requests.get(f"{url}/api/backends", timeout=5).json()
        assert answer["group"] == {"cluster": cluster}
        (backend,) = answer["backends"]
        incident = backend["incident"]
        if incident is not None:            # the dry run may have moved on; the labels stay with it
            assert incident["labels"] == {"cluster": cluster, "namespace": "llm"}
