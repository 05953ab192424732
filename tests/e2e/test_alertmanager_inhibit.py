"""The example Alertmanager config's inhibit rules, run by a real Alertmanager 0.25.

deploy/alertmanager/alertmanager.yml is loaded as shipped except for its webhook (pointed at a closed
loopback port, with a token file in the test's folder) so it starts anywhere. Alerts go in through
POST /api/v2/alerts; GET /api/v2/alerts shows which are suppressed and by whom (inhibitedBy).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import free_port, wait_until
from tests.support.alertmanager import AM_BINARY, running_alertmanager
from tests.support.paths import REPO

AM_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(AM_BINARY is None, reason="prometheus-alertmanager not installed (make debs)"),
]


def harmless_config(tmp_path: Path) -> Path:
    """The example config with its webhook on a closed loopback port and a token file that exists."""
    config = yaml.safe_load(AM_CONFIG.read_text())
    token = tmp_path / "remediator.token"
    token.write_text("test-token\n")
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs") or []:
            hook["url"] = f"http://127.0.0.1:{free_port()}/webhook"
            hook["http_config"]["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    with running_alertmanager(harmless_config(tmp_path), tmp_path) as url:
        yield url


def post_alerts(url: str, *label_sets: dict[str, str]) -> None:
    body = [{"labels": labels, "annotations": {"summary": "test"}} for labels in label_sets]
    response = requests.post(f"{url}/api/v2/alerts", json=body, timeout=5)
    assert response.status_code == 200, response.text


def alert_status(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(alertname, backend) -> {"state", "inhibitedBy", "fingerprint"} of every alert Alertmanager holds."""
    response = requests.get(f"{url}/api/v2/alerts", timeout=5)
    response.raise_for_status()
    return {
        (a["labels"]["alertname"], a["labels"].get("backend", "")): {**a["status"], "fingerprint": a["fingerprint"]}
        for a in response.json()
    }


def settled(url: str, expected: dict[tuple[str, str], str]) -> dict[tuple[str, str], dict[str, Any]] | None:
    """The alert status once every expected alert is listed in its expected state, else None."""
    status = alert_status(url)
    if all(key in status and status[key]["state"] == state for key, state in expected.items()):
        return status
    return None


def test_a_restarting_backend_inhibits_its_error_rate_alerts(alertmanager: str) -> None:
    restarted = {"alertname": "LLMBackendRestarted", "backend": "a", "severity": "info"}
    post_alerts(
        alertmanager,
        restarted,
        {"alertname": "LLMBackendErrorRate", "backend": "a", "severity": "warning", "category": "error-rate"},
        {"alertname": "LLMBackendErrorRate", "backend": "b", "severity": "warning", "category": "error-rate"},
        # An operator's own error-rate alert, labelled as the config's header asks.
        {"alertname": "IngressHTTP5xx", "backend": "a", "severity": "warning", "category": "error-rate"},
    )
    expected = {
        ("LLMBackendErrorRate", "a"): "suppressed",
        ("IngressHTTP5xx", "a"): "suppressed",
        ("LLMBackendErrorRate", "b"): "active",
        ("LLMBackendRestarted", "a"): "active",
    }
    status = wait_until(lambda: settled(alertmanager, expected), timeout=10, what=f"alert states {expected}")
    source = status[("LLMBackendRestarted", "a")]["fingerprint"]
    assert status[("LLMBackendErrorRate", "a")]["inhibitedBy"] == [source]
    assert status[("IngressHTTP5xx", "a")]["inhibitedBy"] == [source]
    assert status[("LLMBackendErrorRate", "b")]["inhibitedBy"] == []


def test_a_down_backend_inhibits_its_stall_and_error_rate_alerts(alertmanager: str) -> None:
    post_alerts(
        alertmanager,
        {"alertname": "LLMBackendDown", "backend": "a", "severity": "critical", "remediation": "restart"},
        {"alertname": "LLMBackendStalled", "backend": "a", "severity": "critical", "remediation": "restart"},
        {"alertname": "LLMBackendErrorRate", "backend": "a", "severity": "warning", "category": "error-rate"},
        {"alertname": "LLMBackendStalled", "backend": "b", "severity": "critical", "remediation": "restart"},
    )
    expected = {
        ("LLMBackendStalled", "a"): "suppressed",
        ("LLMBackendErrorRate", "a"): "suppressed",
        ("LLMBackendStalled", "b"): "active",
        ("LLMBackendDown", "a"): "active",
    }
    status = wait_until(lambda: settled(alertmanager, expected), timeout=10, what=f"alert states {expected}")
    source = status[("LLMBackendDown", "a")]["fingerprint"]
    assert status[("LLMBackendStalled", "a")]["inhibitedBy"] == [source]
    assert status[("LLMBackendErrorRate", "a")]["inhibitedBy"] == [source]


def test_error_rate_alerts_are_not_inhibited_without_a_restart(alertmanager: str) -> None:
    """The inhibition is tied to a restart of the same backend, and to the category label: another
    backend's error-rate alert and an unlabelled alert beside the restart stay active. (The labelled
    alert of the restarting backend, suppressed, shows the inhibitor has seen the restart.)"""
    post_alerts(
        alertmanager,
        {"alertname": "LLMBackendErrorRate", "backend": "a", "severity": "warning", "category": "error-rate"},
        {"alertname": "LLMBackendRestarted", "backend": "c", "severity": "info"},
        {"alertname": "LLMBackendErrorRate", "backend": "c", "severity": "warning", "category": "error-rate"},
        {"alertname": "UnlabelledHTTP5xx", "backend": "c", "severity": "warning"},
    )
    expected = {
        ("LLMBackendErrorRate", "c"): "suppressed",
        ("LLMBackendErrorRate", "a"): "active",
        ("LLMBackendRestarted", "c"): "active",
        ("UnlabelledHTTP5xx", "c"): "active",
    }
    status = wait_until(lambda: settled(alertmanager, expected), timeout=10, what=f"alert states {expected}")
    assert status[("LLMBackendErrorRate", "a")]["inhibitedBy"] == []
    assert status[("UnlabelledHTTP5xx", "c")]["inhibitedBy"] == []


def test_the_same_backend_name_in_another_cluster_is_not_inhibited(alertmanager: str) -> None:
    """With --group-labels cluster, backend `a` of east and backend `a` of west are two backends: east
    going down must not silence west's stall (a label neither alert has still counts as equal)."""
    post_alerts(
        alertmanager,
        {"alertname": "LLMBackendDown", "backend": "a", "cluster": "east", "severity": "critical"},
        {"alertname": "LLMBackendStalled", "backend": "a", "cluster": "east", "severity": "critical"},
        {"alertname": "LLMBackendStalled", "backend": "a", "cluster": "west", "severity": "critical"},
    )

    def states() -> dict[tuple[str, str], dict[str, Any]] | None:
        response = requests.get(f"{alertmanager}/api/v2/alerts", timeout=5)
        response.raise_for_status()
        got = {(a["labels"]["alertname"], a["labels"].get("cluster", "")): a["status"] for a in response.json()}
        want = {("LLMBackendStalled", "east"): "suppressed", ("LLMBackendStalled", "west"): "active",
                ("LLMBackendDown", "east"): "active"}
        return got if all(k in got and got[k]["state"] == s for k, s in want.items()) else None

    status = wait_until(states, timeout=10, what="east stall suppressed, west stall active")
    assert status[("LLMBackendStalled", "west")]["inhibitedBy"] == []
