"""The authority's lease (remediator/lease.py): one holder, until it expires; every takeover a new term
(epoch), and an action starts only with half the lease left.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator.authority import Authority
from llm_health.remediator.lease import ACTION_MARGIN, NAME
from llm_health.remediator.store import Lease
from tests.support.remediator import World, four_backends


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_only_one_lease_holder(w: World) -> None:
    other = Authority(w.store, w.authority.ctx.config, clock=w.clock, holder="other")
    assert not other.lease.renew()
    w.clock.advance(w.authority.lease.ttl + 1)
    assert other.lease.renew()
    assert not w.authority.lease.renew()


# -- terms: the epoch is a fencing token ------------------------------------------------------------------
def test_every_takeover_is_a_new_epoch_and_a_renewal_keeps_it(w: World) -> None:
    lease = w.authority.lease
    first = lease.epoch
    assert first >= 1 and w.store.lease(NAME).epoch == first
    assert lease.renew() and lease.epoch == first == w.store.lease(NAME).epoch     # a renewal: same term
    other = Authority(w.store, w.authority.ctx.config, clock=w.clock, holder="other")
    w.clock.advance(lease.ttl + 1)
    assert other.lease.renew() and other.lease.epoch == first + 1
    with w.store.tx() as tx:
        assert not lease.holds(tx) and other.lease.holds(tx)
    w.clock.advance(other.lease.ttl + 1)
    assert lease.renew() and lease.epoch == first + 2                              # back: a third term
    got = [e.detail.get("epoch") for e in reversed(w.store.events(kind="lease_acquired"))]
    assert got[-2:] == [first + 1, first + 2]


def test_a_lease_that_lapsed_is_a_new_term_for_its_own_holder(w: World) -> None:
    lease = w.authority.lease
    first, terms = lease.epoch, []
    lease.on_new_term = lambda: terms.append(1)
    w.clock.advance(lease.ttl + 1)
    assert lease.renew() and lease.epoch == first + 1 and terms == [1]


def test_an_older_term_holds_nothing_though_its_name_and_clock_match(w: World) -> None:
    """A lease row with our holder name and boot but another epoch (a second instance that took over under
    the same name): not ours, and nothing may be written under it."""
    lease = w.authority.lease
    row = w.store.lease(NAME)
    with w.store.tx() as tx:
        tx.put_lease(Lease(NAME, row.holder, row.expires_at, row.boot, row.epoch + 1))
    with w.store.tx() as tx:
        assert not lease.holds(tx) and not lease.fit_to_act(tx)


def test_fit_to_act_wants_half_the_lease_left(w: World) -> None:
    lease = w.authority.lease
    with w.store.tx() as tx:
        assert lease.fit_to_act(tx)
    w.clock.advance(lease.ttl * (1 - ACTION_MARGIN) + 0.5)
    with w.store.tx() as tx:
        assert lease.holds(tx) and not lease.fit_to_act(tx)
