"""What a step answers: when to look at the incident again (controller-runtime's reconcile.Result).

A step never writes "look again" for the scheduler to read back: it returns `LookAgain(at)` (monotonic)
or `DONE` (nothing before the next resync, which comes every poll_interval for every active incident).
The store still records `next_check_at` (other workers, the next holder after a restart and /api/backends
read it); the scheduler uses the step's answer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LookAgain:
    at: float                     # monotonic


@dataclass(frozen=True)
class Done:
    """Nothing to do before the next resync (closed, moved on, or due again at once)."""


DONE = Done()
StepResult = LookAgain | Done


def look_again(at: float, now: float) -> StepResult:
    """LookAgain(at) when `at` is still ahead of `now`, else DONE (the next resync is soon enough)."""
    return LookAgain(at) if at > now else DONE


def seconds_until(result: StepResult, now: float) -> float | None:
    """For the scheduler: seconds until the next look, or None for "at the next resync"."""
    if isinstance(result, LookAgain) and result.at > now:
        return result.at - now
    return None
