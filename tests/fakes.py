"""Test doubles shared by the pure-logic tests."""

from __future__ import annotations


class FakeClock:
    """An injected clock that moves only when the test says so."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
