"""Starting and stopping real processes on loopback: tests, the demo and benchmarks share this.

Waiting is always polling with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not become true before its deadline."""


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now and was never handed out before by this process.

    The port is released before the caller binds it, so the operating system may offer it again
    to the next call; two components of one stack would then race for it (one fails to bind, and a
    readiness check may be answered by the other). Remembering what was handed out rules that out.
    """
    with _handed_out_lock:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no free loopback port that was not handed out already")


def wait_until(
    condition: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll `condition` until it returns a truthy value; return that value or raise WaitTimeout."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - the condition may fail until ready
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
        time.sleep(interval)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """The URL answers with a 2xx: a readiness check (a 404 may come from some other program)."""
    try:
        return 200 <= requests.get(url, timeout=timeout).status_code < 300
    except requests.RequestException:
        return False


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class ManagedProcess:
    """A child process with its output in a log file; stop() always reaps it (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        argv: Sequence[str],
        name: str,
        log_dir: str | Path,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return http_ok(url)

        try:
            wait_until(ready, timeout=timeout, what=f"{self.name} at {url}")
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n--- {self.name} log ---\n{self.log()[-3000:]}") from None

    def kill9(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        else:
            # the leader is gone; make sure no child of its group lingers
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not self._log.closed:
            self._log.close()


def python_module(module: str, *args: Any) -> list[str]:
    """argv that runs `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *[str(a) for a in args]]


def llm_health(*args: Any) -> list[str]:
    """argv for the `llm-health` command with this interpreter (works without the venv on PATH)."""
    return [sys.executable, "-m", "llm_health.cli", *[str(a) for a in args]]
