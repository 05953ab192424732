"""remediator/silence.py against a real Alertmanager 0.25 process on loopback: a silence suppresses the
one backend's alerts until it is expired; unknown silences and Alertmanager's refusals.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from llm_health.drill.procs import wait_until
from llm_health.remediator.silence import (
    SilenceError,
    create_silence,
    expire_silence,
    get_silence,
)
from tests.support.alertmanager import AM_BINARY, running_alertmanager

AM_CONFIG = """\
route:
  receiver: devnull
  group_wait: 1h
receivers:
  - name: devnull
"""


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if AM_BINARY is None:
        pytest.skip("prometheus-alertmanager not installed")
    tmp: Path = tmp_path_factory.mktemp("am")
    (tmp / "am.yml").write_text(AM_CONFIG)
    with running_alertmanager(tmp / "am.yml", tmp) as url:
        yield url


def _alert_state(am: str, backend: str) -> tuple[str, list[str]]:
    resp = requests.get(f"{am}/api/v2/alerts", params={"filter": f'backend="{backend}"'}, timeout=5)
    resp.raise_for_status()
    items = resp.json()
    if len(items) != 1:
        return "missing", []
    status = items[0]["status"]
    return status["state"], status["silencedBy"]


def _post_alert(am: str, backend: str) -> None:
    now = datetime.now(UTC)
    alert = {
        "labels": {"alertname": "LLMBackendStalled", "backend": backend, "severity": "critical"},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }
    requests.post(f"{am}/api/v2/alerts", json=[alert], timeout=5).raise_for_status()


@pytest.mark.e2e
def test_silence_suppresses_then_expiry_reactivates(alertmanager: str) -> None:
    am = alertmanager
    _post_alert(am, "gpu-a")
    _post_alert(am, "gpu-b")
    wait_until(lambda: _alert_state(am, "gpu-a")[0] == "active", what="alert gpu-a active")

    sid = create_silence(am, "gpu-a", 10, "restart of gpu-a by llm-health", "llm-health-test")
    silence = get_silence(am, sid)
    assert silence is not None and silence["status"] == {"state": "active"}
    assert silence["matchers"] == [{"name": "backend", "value": "gpu-a", "isRegex": False, "isEqual": True}]

    wait_until(lambda: _alert_state(am, "gpu-a") == ("suppressed", [sid]), what="gpu-a silenced")
    assert _alert_state(am, "gpu-b")[0] == "active"        # exact match: the other backend is not muted

    assert expire_silence(am, sid) is True
    wait_until(lambda: _alert_state(am, "gpu-a") == ("active", []), what="gpu-a active again")
    expired = get_silence(am, sid)
    assert expired is not None and expired["status"] == {"state": "expired"}
    assert expire_silence(am, sid) is True                 # expiring twice is fine (200 again)


@pytest.mark.e2e
def test_unknown_silence_counts_as_gone(alertmanager: str) -> None:
    unknown = "00000000-0000-0000-0000-000000000000"
    assert expire_silence(alertmanager, unknown) is False
    assert get_silence(alertmanager, unknown) is None


@pytest.mark.e2e
def test_alertmanager_refusal_is_reported(alertmanager: str) -> None:
    # Alertmanager itself refuses an end before the start: the error carries its answer
    with pytest.raises(SilenceError, match="refused the silence for gpu-a.*HTTP 400"):
        create_silence(alertmanager, "gpu-a", 5, "c", "me",
                       now=datetime.now(UTC) - timedelta(minutes=10))
