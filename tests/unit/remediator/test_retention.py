"""Retention (remediator/retention.py): events and actions pruned, events paginated, and the restart
history inside the policy windows kept; counters never go down.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_health.remediator import retention
from tests.support import stores
from tests.support.fakes import has_sample
from tests.support.remediator import four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

def test_f9_events_and_actions_are_pruned_and_events_paginated(tmp_path: Path) -> None:
    w = four_backends(tmp_path, retention={"max_events": 50, "max_actions": 5, "page_size": 20, "max_age": 86400})
    try:
        now = w.clock()
        with w.store.tx() as tx:
            for i in range(200):
                tx.event(now - 10 * 86400 + i, "received", reason=f"old {i}")
            for i in range(120):
                tx.event(now - 100 + i * 0.1, "received", reason=f"new {i}")
            for i in range(12):
                at = now - 30 * 86400 + i
                tx.finish_action(tx.add_action(0, "gpu-b", "[]", "h", at, at, ""), at, "ok")
        before = w.client.get("/metrics").get_data(as_text=True)
        assert has_sample(before, 'llm_health_remediator_restarts_total{backend="gpu-b",result="ok"} 12')
        retention.prune(w.store, w.authority.ctx.config, now)
        n_events = stores.sql(w.store).execute("SELECT count(*) FROM events").fetchone()[0]
        n_actions = stores.sql(w.store).execute("SELECT count(*) FROM actions").fetchone()[0]
        assert n_events == 50 and n_actions == 0
        after = w.client.get("/metrics").get_data(as_text=True)    # a counter never goes down
        assert has_sample(after, 'llm_health_remediator_restarts_total{backend="gpu-b",result="ok"} 12')
        seen: list[int] = []
        page = w.client.get("/api/events?limit=10000").get_json()
        assert len(page["events"]) == 20
        while True:
            seen += [e["id"] for e in page["events"]]
            if page["next_before"] is None:
                break
            page = w.client.get(f"/api/events?limit=20&before={page['next_before']}").get_json()
        assert len(seen) == len(set(seen)) == 50 and seen == sorted(seen, reverse=True)
    finally:
        w.store.close()


def test_f9_restart_history_inside_the_policy_windows_is_kept(tmp_path: Path) -> None:
    w = four_backends(tmp_path, retention={"max_actions": 1, "max_age": 3600})
    try:
        now = w.clock()
        with w.store.tx() as tx:
            for i in range(3):
                tx.finish_action(tx.add_action(0, "gpu-a", "[]", "h", now - 7000 + i, now - 7000 + i, ""),
                                 now - 6999 + i, "ok")
        retention.prune(w.store, w.authority.ctx.config, now)
        assert len(w.store.restart_times("gpu-a", since=now - 10000)) == 3
    finally:
        w.store.close()
