"""Silences around one restart (remediator/restart/silences.py) against a real Alertmanager 0.25: the
in-process remediator creates one when the drain begins, long enough for the whole restart, and
expires it once the backend is READY again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import requests

from tests.support.alertmanager import AM_BINARY, running_alertmanager
from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import fleet


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    if AM_BINARY is None:
        pytest.skip("prometheus-alertmanager not installed")
    cfg = tmp_path / "am.yml"
    cfg.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
    with running_alertmanager(cfg, tmp_path, cluster=True) as url:
        yield url


def test_silence_covers_the_restart_and_is_removed_after(tmp_path: Path, alertmanager: str) -> None:
    w = fleet(tmp_path, alertmanager_url=alertmanager)
    w.deliver(payload(alert()))
    w.run()
    rows = w.store.conn().execute("SELECT * FROM silences").fetchall()
    assert len(rows) == 1 and rows[0]["backend"] == "gpu-a" and rows[0]["expired_at"] is None
    sil = requests.get(f"{alertmanager}/api/v2/silence/{rows[0]['id']}", timeout=5).json()
    assert sil["status"]["state"] == "active"
    assert sil["matchers"] == [{"name": "backend", "value": "gpu-a", "isRegex": False, "isEqual": True}]
    length = (datetime.fromisoformat(sil["endsAt"]) - datetime.fromisoformat(sil["startsAt"])).total_seconds()
    assert abs(length - (60 + 30 + 100 + 60)) < 2           # drain + action + warm-up timeouts + margin
    w.ready["gpu-a"] = False
    w.clock.advance(5)
    w.run()
    assert requests.get(f"{alertmanager}/api/v2/silence/{rows[0]['id']}", timeout=5).json()["status"]["state"] == \
        "active"
    w.ready["gpu-a"] = True
    w.clock.advance(5)
    w.run()
    assert w.state() == "ready"
    assert requests.get(f"{alertmanager}/api/v2/silence/{rows[0]['id']}", timeout=5).json()["status"]["state"] == \
        "expired"
    assert w.store.conn().execute("SELECT expired_at FROM silences").fetchone()[0] is not None
    kinds = w.kinds("gpu-a")
    assert kinds.index("draining") < kinds.index("silence_created") < kinds.index("restarting")
    assert kinds.index("silence_expired") < kinds.index("recovered")
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(metrics, 'llm_health_remediator_silences_total{result="created"} 1')
    assert has_sample(metrics, 'llm_health_remediator_silences_total{result="expired"} 1')


def test_a_rollout_restart_called_off_during_its_drain_ends_its_silence(tmp_path: Path, alertmanager: str) -> None:
    """A rollout aborted while its canary drains: the restart never begins, and the silence the drain created
    is expired at once (otherwise the backend's alerts stay muted for the whole restart's length)."""
    from llm_health.remediator.rollout.procedure import Procedure
    from tests.support.remediator import AUTH
    from tests.unit.remediator.rollout.test_procedure import NEW, Gate

    w = fleet(tmp_path, ("a1", "a2", "b1"), {"a1": "n1", "a2": "n1", "b1": "n2"}, min_ready=1,
              alertmanager_url=alertmanager, rollout={"prometheus_url": "http://127.0.0.1:9"})
    w.authority.rollouts = Procedure(w.authority.ctx, Gate())
    w.work["a1"] = 1.0                                   # work in flight: the drain waits
    rid = w.client.post("/api/rollouts", json={"command": NEW, "by": "ops", "reason": "v2", "soak": 5},
                        headers=AUTH).get_json()["id"]
    w.run_until(lambda: w.incident("a1") is not None and w.incident("a1").state.value == "draining", "draining")
    (sid,) = [r["id"] for r in w.store.conn().execute("SELECT id FROM silences").fetchall()]
    assert requests.get(f"{alertmanager}/api/v2/silence/{sid}", timeout=5).json()["status"]["state"] == "active"
    w.client.post(f"/api/rollouts/{rid}/abort", json={"by": "ops", "reason": "wrong image"}, headers=AUTH)
    w.run_until(lambda: w.client.get(f"/api/rollouts/{rid}").get_json()["state"] == "rolled_back", "rolled back")
    assert w.calls == [] and w.state("a1") == "ready"
    assert requests.get(f"{alertmanager}/api/v2/silence/{sid}", timeout=5).json()["status"]["state"] == "expired"
