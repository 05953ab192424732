"""The authority's lease (remediator/lease.py): one holder, until it expires; every takeover a new term
(epoch), and an action starts only with half the lease left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator.authority import Authority
from llm_health.remediator.clock import Clocks
from llm_health.remediator.lease import ACTION_MARGIN, NAME, AuthorityLease
from llm_health.remediator.store import Lease
from llm_health.remediator.store.postgresql import PostgresStore
from tests.support.remediator import World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_only_one_lease_holder(w: World) -> None:
    other = Authority(w.store, w.authority.ctx.config, clock=w.clock, holder="other")
    assert not other.lease.renew()
    w.pass_time(w.authority.lease.ttl + 1)
    assert other.lease.renew()
    assert not w.authority.lease.renew()


# -- terms: the epoch is a fencing token ------------------------------------------------------------------
def test_every_takeover_is_a_new_epoch_and_a_renewal_keeps_it(w: World) -> None:
    lease = w.authority.lease
    first = lease.epoch
    assert first >= 1 and w.store.lease(NAME).epoch == first
    assert lease.renew() and lease.epoch == first == w.store.lease(NAME).epoch     # a renewal: same term
    other = Authority(w.store, w.authority.ctx.config, clock=w.clock, holder="other")
    w.pass_time(lease.ttl + 1)
    assert other.lease.renew() and other.lease.epoch == first + 1
    with w.store.tx() as tx:
        assert not lease.holds(tx) and other.lease.holds(tx)
    w.pass_time(other.lease.ttl + 1)
    assert lease.renew() and lease.epoch == first + 2                              # back: a third term
    got = [e.detail.get("epoch") for e in reversed(w.store.events(kind="lease_acquired"))]
    assert got[-2:] == [first + 1, first + 2]


def test_a_lease_that_lapsed_is_a_new_term_for_its_own_holder(w: World) -> None:
    lease = w.authority.lease
    first, terms = lease.epoch, []
    lease.on_new_term = lambda: terms.append(1)
    w.pass_time(lease.ttl + 1)
    assert lease.renew() and lease.epoch == first + 1 and terms == [1]


def test_an_older_term_holds_nothing_though_its_name_and_clock_match(w: World) -> None:
    """A lease row with our holder name and boot but another epoch (a second instance that took over under
    the same name): not ours, and nothing may be written under it."""
    lease = w.authority.lease
    row = w.store.lease(NAME)
    with w.store.tx() as tx:
        tx.put_lease(Lease(NAME, row.holder, row.expires_at, row.boot, row.epoch + 1))
    with w.store.tx() as tx:
        assert not lease.holds(tx) and lease.spare(tx) < 0


def test_the_spare_time_to_act_wants_half_the_lease_left(w: World) -> None:
    lease = w.authority.lease
    with w.store.tx() as tx:
        assert lease.spare(tx) >= 0
    w.pass_time(lease.ttl * (1 - ACTION_MARGIN) + 0.5)
    with w.store.tx() as tx:
        assert lease.holds(tx) and lease.spare(tx) < 0


# -- on PostgreSQL: one clock for the cluster (the database's), holders on different hosts --------------
def _pg_lease(url: str, holder: str, boot: str, mono: list[float], ttl: float = 5.0) -> AuthorityLease:
    store = PostgresStore(url, timeout=5.0)
    store.init()
    return AuthorityLease(store, Clocks(wall=time.time, mono=lambda: mono[0], boot=boot), holder, ttl=ttl,
                          warmup_timeout=60.0)


def _age(lease: AuthorityLease, seconds: float) -> None:
    """`seconds` pass on the database's clock (which a test cannot move: the stored expiry moves back)."""
    with lease.store.tx() as tx:
        row = tx.lease(NAME)
        tx.put_lease(Lease(NAME, row.holder, row.expires_at - seconds, row.boot, row.epoch))


def test_on_postgresql_another_hosts_lease_holds_until_it_expires_on_the_database_clock(pg_url: str) -> None:
    """Two hosts, two monotonic clocks far apart and two boots: on SQLite another boot's lease means nothing
    and is taken at once; on the database's clock it holds for everyone until it expires."""
    a = _pg_lease(pg_url, "host-a:1", "boot-a", [1_000_000.0])
    b = _pg_lease(pg_url, "host-b:1", "boot-b", [5.0])
    try:
        assert a.renew() and a.epoch == 1
        assert not b.renew()                        # another boot, but the lease is alive on the shared clock
        with b.store.tx() as tx:
            assert a.holds(tx) and not b.holds(tx)
            left = a.left(tx)
        assert 0 < left <= a.ttl
        _age(a, a.ttl + 0.5)                        # a froze (SIGSTOP) and did not renew in time
        with a.store.tx() as tx:
            assert not a.holds(tx) and a.spare(tx) < 0
        assert b.renew() and b.epoch == 2
        assert not a.renew()                        # resumed: b's lease is alive, a acts on nothing
        with a.store.tx() as tx:
            assert not a.holds(tx) and b.holds(tx)
    finally:
        a.store.close()
        b.store.close()


def test_on_postgresql_a_takeover_from_another_host_rebases_the_stored_deadlines(pg_url: str) -> None:
    a = _pg_lease(pg_url, "host-a:1", "boot-a", [1_000_000.0])
    b_mono = [5.0]
    b = _pg_lease(pg_url, "host-b:1", "boot-b", b_mono)
    same_host = _pg_lease(pg_url, "host-b:2", "boot-b", b_mono)
    try:
        assert a.renew()
        with a.store.tx() as tx:
            i = tx.open_incident("gpu-a", time.time())
            tx.look_again_at(i, 1_000_030.0)        # on host a's monotonic clock
        _age(a, a.ttl + 1)
        assert b.renew()
        inc = b.store.incident(i)
        assert inc is not None and inc.next_check_at == 0       # rebased: look now, on b's clock
        with b.store.tx() as tx:
            tx.look_again_at(i, 35.0)
        _age(b, b.ttl + 1)
        assert same_host.renew()                    # same boot: b's deadlines are on its clock too
        inc = same_host.store.incident(i)
        assert inc is not None and inc.next_check_at == 35.0
    finally:
        for lease in (a, b, same_host):
            lease.store.close()
