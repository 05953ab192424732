"""Backends outside any restart (remediator/lifecycle_watch.py): ERROR backends are checked after the
incidents and at most every 30 s, and a check that raises for one never starves the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import stores
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = fleet(tmp_path)
    yield world
    world.close()


def test_a_lifecycle_check_that_raises_never_starves_the_other_backends(w: World) -> None:
    """Backends outside a restart are looked at oldest first; a check raising for the first one ended
    the pass before the others (and it stayed first in line): they were never marked READY."""
    stores.sql(w.store).execute("UPDATE lifecycle SET state = 'initializing', incident_id = NULL")
    answers = w.authority.io.first_seen_check

    def check(b: Any) -> tuple[bool, str]:
        if b.name == "gpu-a":
            raise RuntimeError("odd answer")
        return answers(b)

    w.authority.io.first_seen_check = check
    for _ in range(3):
        w.clock.advance(10)                         # past warmup_poll: both due
        w.run(1)
    assert w.state("gpu-b") == "ready"
    assert w.state("gpu-a") == "initializing"


def to_error(w: World, name: str) -> None:
    w.ready[name] = False
    w.deliver(payload(alert(name)))
    w.run()
    w.clock.advance(5)
    w.run()
    w.clock.advance(101)
    w.run()
    assert w.state(name) == "error"
    assert w.client.post(f"/api/backends/{name}/ack", headers=AUTH).status_code == 200


def test_error_backends_are_checked_after_incidents_and_at_most_every_30s(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    to_error(w, "gpu-a")
    order: list[str] = []
    warm, verify = w.authority.io.warmup_check, w.authority.io.verifier
    w.authority.io.warmup_check = lambda b: (order.append(f"warmup {b.name}"), warm(b))[1]
    w.authority.io.verifier = lambda b: (order.append(f"verify {b.name}"), verify(b))[1]
    w.clock.advance(60)
    w.deliver(payload(alert("gpu-b")))
    w.run(1)
    assert order == ["verify gpu-b", "warmup gpu-a"]
    for _ in range(29):
        w.clock.advance(1)
        w.run(1)
    assert order.count("warmup gpu-a") == 1
    w.clock.advance(1)
    w.run(1)
    assert order.count("warmup gpu-a") == 2
