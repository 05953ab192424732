"""simulator/cli.py: the process edge of the simulator."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator

import pytest

from simulator import cli


@pytest.fixture
def keep_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


class SignalledOnStart:
    """A simulator whose listener 'answers' at once, and is sent SIGTERM as soon as it does."""

    handler_at_start: object = None
    stopped = False

    def __init__(self, config: object) -> None:
        self.url = "http://127.0.0.1:1"
        self.control_url = ""

    def start(self) -> None:
        SignalledOnStart.handler_at_start = signal.getsignal(signal.SIGTERM)
        if SignalledOnStart.handler_at_start in (signal.SIG_DFL, signal.SIG_IGN, None):
            raise AssertionError("listening before SIGTERM has a handler: an early SIGTERM kills the process")
        signal.raise_signal(signal.SIGTERM)

    def stop(self) -> None:
        SignalledOnStart.stopped = True


def test_sigterm_right_after_listening_stops_cleanly(monkeypatch: pytest.MonkeyPatch, keep_handlers: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    monkeypatch.setattr(cli, "Simulator", SignalledOnStart)
    monkeypatch.setattr(cli, "config_from_args", lambda args: None)
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    assert cli.run(parser.parse_args([])) == 0
    assert SignalledOnStart.stopped
