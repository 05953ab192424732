"""Helpers for the tests of the in-process simulator: its stats, its fault API, a request in the background."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import requests

from llm_health.simulator.server import Simulator


def stats(sim: Simulator) -> dict[str, Any]:
    return requests.get(f"{sim.control_url}/sim/stats", timeout=5).json()


def fault(base: str, body: Any) -> requests.Response:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return requests.post(base + "/sim/fault", data=data, timeout=5)


class Background:
    """One HTTP call in a thread; `.result` is the response or the exception."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = call()
            except Exception as exc:  # noqa: BLE001 - reported to the test
                self.result = exc
            self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def completion(url: str, max_tokens: int, headers: dict[str, str] | None = None, prompt: Any = "hi") -> Background:
    return Background(lambda: requests.post(
        url + "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens},
        headers=headers, timeout=30,
    ))
