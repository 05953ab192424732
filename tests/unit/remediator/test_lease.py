"""The authority's lease (remediator/lease.py): one holder, until it expires.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.remediator.authority import Authority
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
