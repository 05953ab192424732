"""What the API and the status page show (remediator/web/views.py): monotonic deadlines as wall time,
credentials redacted and restart output hidden without the token, events of older versions rendered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import stores
from tests.support.remediator import AUTH, World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_monotonic_deadlines_are_shown_as_wall_time() -> None:
    # The authority stores deadlines on the monotonic clock; the API and status page show wall time.
    from llm_health.remediator.clock import Clocks
    from llm_health.remediator.web.views import MONOTONIC_INCIDENT_FIELDS, shown

    clocks = Clocks(wall=lambda: 1_700_000_000.0, mono=lambda: 500.0)
    row = {"id": 1, "opened_at": 1_699_999_990.0, "next_check_at": 510.0, "warm_deadline": None,
           "unresponsive_since": 470.0}
    view = shown(clocks, row, MONOTONIC_INCIDENT_FIELDS)
    assert view["next_check_at"] == 1_700_000_010.0
    assert view["unresponsive_since"] == 1_699_999_970.0
    assert view["warm_deadline"] is None
    assert view["opened_at"] == row["opened_at"]  # wall time already: untouched


def test_f10_unauthenticated_gets_redact_credentials_and_hide_output(tmp_path: Path) -> None:
    w = four_backends(tmp_path)
    try:
        secret_url = "http://admin:hunter2@10.0.0.5:8000"
        with w.store.tx() as tx:
            tx.event(1.0, "failed", "gpu-a", reason=f"could not reach {secret_url}",
                     output="restart failed: password=hunter2", url=secret_url)
        for path in ("/api/events", "/", "/api/backends"):
            body = w.client.get(path).get_data(as_text=True)
            assert "hunter2" not in body, path
        authed = w.client.get("/api/events", headers=AUTH).get_json()["events"][0]
        assert "password=hunter2" in authed["detail"]["output"]      # the operator with the token sees it
    finally:
        w.store.close()


def test_f6_an_event_cut_by_an_older_version_still_renders(w: World) -> None:
    stores.sql(w.store).execute("INSERT INTO events (at, kind, reason, detail) VALUES (1, 'ignored', 'old', ?)",
                           ('{"labels": {"a": "\\u04',))
    assert w.client.get("/").status_code == 200
    assert w.client.get("/api/events").status_code == 200
