"""free_port: a port promised to one taker is never promised to another, in this process or another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llm_health.drill import procs


@pytest.fixture
def ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(procs.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def test_ports_come_from_outside_the_kernels_ephemeral_range(ledger_dir: Path) -> None:
    low, high = procs._ephemeral_range()
    band = procs.port_band()
    assert band is not None, "this machine's ephemeral range leaves no band (the tests assume Linux's default)"
    for _ in range(50):
        port = procs.free_port()
        assert not low <= port <= high, port
        assert band[0] <= port < band[1]


def test_two_processes_picking_the_same_way_never_get_the_same_port(ledger_dir: Path) -> None:
    # Both pickers start from the same random sequence: without the shared ledger they would hand out
    # the very same ports (as two test workers did, one Alertmanager then failing to bind).
    procs._rng.seed(7)
    ours = [procs.free_port() for _ in range(40)]
    code = (
        "import sys, tempfile\n"
        "from llm_health.drill import procs\n"
        f"tempfile.gettempdir = lambda: {str(ledger_dir)!r}\n"
        "procs._rng.seed(7)\n"
        "print(' '.join(str(procs.free_port()) for _ in range(40)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    theirs = [int(p) for p in done.stdout.split()]
    assert len(theirs) == 40
    assert not set(ours) & set(theirs)


def test_a_promise_expires_so_the_ledger_stays_small(ledger_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    procs.free_port()
    ledger = next(ledger_dir.glob("llm-health-ports-*"))
    assert len(ledger.read_text().splitlines()) == 1
    now = procs.time.time()
    monkeypatch.setattr(procs.time, "time", lambda: now + procs.LEDGER_HOLD + 1)
    procs.free_port()
    assert len(ledger.read_text().splitlines()) == 1, "the expired promise is dropped when the next one is written"


def test_a_port_in_use_is_never_handed_out(ledger_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        picks = iter([taken, taken])
        real = procs._rng.randrange
        monkeypatch.setattr(procs._rng, "randrange", lambda a, b: next(picks, None) or real(a, b))
        assert procs.free_port() != taken
