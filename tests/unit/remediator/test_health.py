"""A truthful /healthz (remediator/health.py): it fails when the store cannot be written, when a page
of the state is corrupted, and when the authority's loop stops.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import stores
from tests.support.remediator import World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_f2_healthz_fails_when_the_store_cannot_be_written(w: World) -> None:
    stores.sqlite_only("a connection put in query_only mode (PostgreSQL: tests/e2e/test_ha.py stops the server)")
    assert w.client.get("/healthz").status_code == 200
    stores.sql(w.store).execute("PRAGMA query_only = ON")              # this worker's connection refuses writes
    r = w.client.get("/healthz")
    assert r.status_code == 503 and "not writable" in " ".join(r.get_json()["problems"])


def test_f2_healthz_fails_on_a_corrupted_page(w: World) -> None:
    stores.sqlite_only("a scribbled page of the state file")
    with w.store.tx() as tx:
        for i in range(300):
            tx.event(float(i), "received", reason="x" * 500)
    stores.sql(w.store).execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(w.store.path, "r+b") as f:                          # scribble over the middle of the file
        f.seek(4096 * 6)
        f.write(os.urandom(4096 * 4))
    w.client.application.extensions["remediator"].health._integrity = None
    r = w.client.get("/healthz")
    assert r.status_code == 503, r.get_json()


def test_f2_healthz_fails_when_the_authority_loop_stops(w: World) -> None:
    health = w.client.application.extensions["remediator"].health
    health.authority = w.authority
    assert w.client.get("/healthz").status_code == 200
    w.authority.last_pass -= 10_000                               # the loop has not come round for hours
    r = w.client.get("/healthz")
    assert r.status_code == 503 and "authority loop" in " ".join(r.get_json()["problems"])
