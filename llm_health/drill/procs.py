"""Starting and stopping real processes on loopback: tests, the demo and benchmarks share this.

Waiting is always polling with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
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
_rng = random.Random()
LEDGER_HOLD = 600.0          # a port stays promised to its taker this long (seconds, wall clock)
_LEDGER_NAME = "llm-health-ports"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999      # Linux's default


def port_band() -> tuple[int, int] | None:
    """Where free_port picks from: loopback ports the kernel never hands out on its own.

    The kernel takes the source port of every outgoing connection (and every `bind(("", 0))`)
    from the ephemeral range, so a port picked there and released can be taken by a connection
    before its server binds it: Alertmanager then fails with "address already in use". Below
    (or above) that range only an explicit bind takes a port. None: no band wide enough.
    """
    low, high = _ephemeral_range()
    if low - 10000 >= 2000:
        return 10000, low
    if 65536 - (high + 1) >= 2000:
        return high + 1, 65536
    return None


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now and no process on this machine was promised in the last ten minutes.

    The port is released before the caller binds it. In that gap three things could take it: the
    next call in this process, another process picking ports at the same time (two test workers,
    a test and a benchmark), and the kernel for an outgoing connection. The first two are ruled out
    by a ledger of promised ports shared through a locked file in the temporary folder, the third
    by picking outside the ephemeral range (port_band()).
    """
    band = port_band()
    with _handed_out_lock, _Ledger() as ledger:
        for _ in range(2000):
            port = _rng.randrange(*band) if band else _kernel_port(host)
            if port in _handed_out or port in ledger or not _can_bind(host, port):
                continue
            _handed_out.add(port)
            ledger.promise(port)
            return port
    raise RuntimeError("no free loopback port that was not promised already")


class _Ledger:
    """Ports promised by free_port in any process of this user, with when; under an exclusive lock.

    Entries older than LEDGER_HOLD are dropped, so the file stays small and a crashed taker's
    ports come free again. If the file cannot be used, the ledger is empty (this process's own
    record and the port band still hold)."""

    def __init__(self) -> None:
        self.path = Path(tempfile.gettempdir()) / f"{_LEDGER_NAME}-{os.getuid()}"
        self.entries: dict[int, float] = {}
        self._fd: int | None = None
        self._changed = False

    def __enter__(self) -> _Ledger:
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            raw = os.read(self._fd, 1 << 20).decode("ascii", "replace")
        except OSError:
            self._close()
            return self
        now = time.time()
        for line in raw.splitlines():
            port, _, when = line.partition(" ")
            try:
                if now - float(when) < LEDGER_HOLD:
                    self.entries[int(port)] = float(when)
            except ValueError:
                continue
        return self

    def __contains__(self, port: int) -> bool:
        return port in self.entries

    def promise(self, port: int) -> None:
        self.entries[port] = time.time()
        self._changed = True

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None and self._changed:
            body = "".join(f"{port} {when:.3f}\n" for port, when in self.entries.items()).encode()
            try:
                os.lseek(self._fd, 0, os.SEEK_SET)
                os.ftruncate(self._fd, 0)
                os.write(self._fd, body)
            except OSError:
                pass
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)    # closing drops the lock
            self._fd = None


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP (a timeout, a closed terminal) end this process like Ctrl-C, so its `finally`
    blocks and context managers stop every process it started (ManagedProcess and the servers run in
    their own sessions: the signal does not reach them). Signals someone else handles are left alone;
    SIGKILL cannot be helped."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _interrupted)


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
