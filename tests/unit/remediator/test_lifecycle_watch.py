"""Backends outside any restart (remediator/lifecycle_watch.py): a check that raises for one never
starves the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.alerts import one_pass
from tests.support.remediator import World, fleet


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = fleet(tmp_path)
    yield world
    world.close()


def test_a_lifecycle_check_that_raises_never_starves_the_other_backends(w: World) -> None:
    """Backends outside a restart are looked at oldest first; a check raising for the first one ended
    the pass before the others (and it stayed first in line): they were never marked READY."""
    w.store.conn().execute("UPDATE lifecycle SET state = 'initializing', incident_id = NULL")
    answers = w.authority.io.answer_check

    def check(b: Any) -> tuple[bool, str]:
        if b.name == "gpu-a":
            raise RuntimeError("odd answer")
        return answers(b)

    w.authority.io.answer_check = check
    for _ in range(3):
        w.clock.advance(10)                         # past warmup_poll: both due
        one_pass(w.authority)
    assert w.state("gpu-b") == "ready"
    assert w.state("gpu-a") == "initializing"
