"""The authority's two clocks: wall time for people, monotonic time for every deadline.

`wall` stamps events and what the status page shows (and the restart history that budget, backoff and
breaker count, because it must survive a reboot). `mono` drives everything that must not jump when
an administrator or NTP steps the wall clock: the lease, action timeouts, drain and warm-up
deadlines, the next look at an incident, the "unresponsive for N s" window.

Monotonic values are stored in the state (incident and drain deadlines; on SQLite the lease expiry too)
and compared by other processes. That is sound because CLOCK_MONOTONIC is one system-wide clock on
Linux: every gunicorn worker on the host reads the same counter (`time.monotonic()` is comparable across
processes on one host). On SQLite all workers that share the file run on ONE host (it must not live on a
network filesystem). After a reboot the counter starts again near zero, so the lease row also records
the boot id; a holder that finds another boot id rebases the stored deadlines (remediator/lease.py).
On PostgreSQL the remediators run on several hosts: the lease is timed by the database's clock instead,
and a holder taking over from another host (another boot id) rebases the deadlines the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def wall_text(t: float | None) -> str:
    """A wall time as people read it (the status page, `llm-health ctl`): UTC to the second, '-' for none."""
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t))) + "Z"


def boot_id() -> str:
    """This boot's id (Linux); "" where there is none (then a reboot cannot be told apart)."""
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Clocks:
    wall: Callable[[], float] = time.time
    mono: Callable[[], float] = time.monotonic
    boot: str = ""

    def wall_of(self, mono_t: float) -> float:
        """A monotonic instant shown as wall time (for people and policy's wall-time inputs)."""
        return self.wall() - (self.mono() - mono_t)

    def mono_of(self, wall_t: float) -> float:
        """A wall-time instant (e.g. a policy retry_at) as a monotonic deadline."""
        return self.mono() + (wall_t - self.wall())


def system() -> Clocks:
    return Clocks(time.time, time.monotonic, boot_id())


def injected(clock: Callable[[], float], mono: Callable[[], float] | None = None) -> Clocks:
    """Clocks for an injected wall clock: with no monotonic clock given, the injected one drives both
    (tests that move one fake clock keep their meaning); with the real time.time, the real monotonic."""
    if mono is None:
        mono = time.monotonic if clock is time.time else clock
    return Clocks(clock, mono, boot_id())
