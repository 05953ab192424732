"""Real simulator and exporter processes for tests (the `sim` and `exporter` fixtures of conftest.py).

Small intervals (0.3 s) and grace periods (2 s) keep the tests short; every wait is a deadline poll.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.exporter.reading import read_text

INTERVAL = 0.3
STALL_AFTER = 2.0


class Sim:
    def __init__(self, proc: ManagedProcess, port: int, control: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.control = f"http://127.0.0.1:{control}"

    def stats(self) -> dict[str, Any]:
        return requests.get(self.control + "/sim/stats", timeout=5).json()

    def fault(self, name: str, seconds: float | None = None) -> None:
        body: dict[str, Any] = {"fault": name}
        if seconds is not None:
            body["seconds"] = seconds
        r = requests.post(self.control + "/sim/fault", json=body, timeout=5)
        assert r.status_code == 200, r.text

    def reading(self):  # noqa: ANN201
        return read_text(requests.get(self.url + "/metrics", timeout=5).text)


class Exporter:
    def __init__(self, proc: ManagedProcess, port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def verdicts(self) -> dict[str, Any]:
        return requests.get(self.url + "/verdicts", timeout=5).json()

    def backend(self, name: str) -> dict[str, Any]:
        return next(b for b in self.verdicts()["backends"] if b["backend"] == name)

    def verdict(self, name: str) -> str:
        return self.backend(name)["verdict"]

    def proxy(self, name: str) -> dict[str, Any]:
        return next(p for p in self.verdicts()["proxies"] if p["proxy"] == name)

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=5).text

    def wait_verdict(self, name: str, verdict: str, timeout: float = 10.0) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            b = self.backend(name)
            return b if b["verdict"] == verdict else None

        try:
            return wait_until(reached, timeout=timeout, interval=0.03, what=f"{name} {verdict}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; now {self.backend(name)}\n{self.proc.log()[-2000:]}") from None

    def wait_cycles(self, n: int, timeout: float = 20.0) -> None:
        target = self.verdicts()["cycles"] + n
        wait_until(lambda: self.verdicts()["cycles"] >= target, timeout=timeout, interval=0.05,
                   what=f"{n} more cycles")


def sim_factory(launch: Callable[..., ManagedProcess]) -> Callable[..., Sim]:
    count = [0]

    def start(*extra: Any) -> Sim:
        count[0] += 1
        port, control = free_port(), free_port()
        proc = launch(llm_health("sim", "--port", port, "--control-port", control, *extra), f"sim{count[0]}")
        s = Sim(proc, port, control)
        proc.wait_http(s.control + "/sim/stats")
        proc.wait_http(s.url + "/v1/models")
        return s

    return start


def exporter_factory(launch: Callable[..., ManagedProcess]) -> Callable[..., Exporter]:
    def start(backends: dict[str, str], proxies: dict[str, str] | None = None, *extra: Any) -> Exporter:
        port = free_port()
        argv = ["exporter", "--listen", f"127.0.0.1:{port}", "--interval", INTERVAL,
                "--stall-after", STALL_AFTER, "--read-timeout", 0.5, "--probe-timeout", 2]
        for name, url in backends.items():
            argv += ["--backend", f"{name}={url}"]
        for name, url in (proxies or {}).items():
            argv += ["--proxy", f"{name}={url}"]
        proc = launch(llm_health(*argv, *extra), "exporter")
        e = Exporter(proc, port)
        proc.wait_http(e.url + "/health")
        return e

    return start
