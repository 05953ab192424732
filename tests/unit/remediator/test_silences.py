"""Silences around one restart (remediator/restart/silences.py): an Alertmanager that cannot be reached
is recorded and never holds the restart back. With a real Alertmanager: tests/e2e/test_silences.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_health.drill.procs import free_port
from tests.support import stores
from tests.support.alerts import alert, payload
from tests.support.remediator import World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

def restart_cycle(w: World, name: str = "gpu-a") -> None:
    """From an alert to READY again: stalled (work stays 1, counters frozen) -> drain timeout -> restart."""
    w.ready[name] = False
    w.deliver(payload(alert(name)))
    w.run()
    assert w.state(name) == "draining"
    w.clock.advance(5)                             # stalled_drain_timeout
    w.run()
    assert w.state(name) == "initializing"
    w.ready[name] = True
    w.clock.advance(5)
    w.run()
    assert w.state(name) == "ready"


def test_unreachable_alertmanager_is_recorded_and_never_blocks_the_restart(tmp_path: Path) -> None:
    w = fleet(tmp_path, alertmanager_url=f"http://127.0.0.1:{free_port()}")
    restart_cycle(w)
    assert w.restarted == ["gpu-a"]
    failed = w.store.events(kind="silence_failed")
    assert len(failed) == 1 and "restart goes on" in failed[0].reason
    assert stores.sql(w.store).execute("SELECT count(*) FROM silences").fetchone()[0] == 0
