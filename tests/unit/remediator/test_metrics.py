"""/metrics (remediator/metrics.py): prometheus_client's exposition with the standard process series
and the state's own, needs_ack among them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator.store import IncidentState
from tests.support.fakes import has_sample
from tests.support.remediator import World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_f1_metrics_come_from_prometheus_client_with_needs_ack_and_process_series(w: World) -> None:
    text = w.client.get("/metrics").get_data(as_text=True)
    assert "process_cpu_seconds_total" in text and "python_info" in text        # the standard series
    assert has_sample(text, 'llm_health_remediator_needs_ack{backend="gpu-a"} 0')
    assert has_sample(text, "llm_health_remediator_healthy 1")
    with w.store.tx() as tx:
        tx.move_incident(tx.open_incident("gpu-a", 1), 1, IncidentState.NEEDS_ACK)
    text = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(text, 'llm_health_remediator_needs_ack{backend="gpu-a"} 1')


def test_the_lease_is_shown_holder_epoch_and_time_left(w: World) -> None:
    lease = w.authority.lease
    text = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(text, f'llm_health_remediator_lease_holder_info{{holder="{lease.holder}"}} 1')
    assert has_sample(text, f"llm_health_remediator_lease_epoch {lease.epoch}")
    (left,) = [float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("llm_health_remediator_lease_seconds_left ")]
    if w.store.lease_clock() is not None:             # the database's clock (PostgreSQL)
        assert 0 < left <= lease.ttl
        w.pass_time(lease.ttl + 1)
        text = w.client.get("/metrics").get_data(as_text=True)
        (left,) = [float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("llm_health_remediator_lease_seconds_left ")]
        assert left < 0                                                          # nobody leads
