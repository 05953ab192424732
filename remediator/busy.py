"""`llm-health busy --backend NAME [--ttl S] [--remediator URL | --config FILE] -- COMMAND ...`

Runs a batch job with a busy marker set for a backend: through the remediator's API when a URL is
given, else as a file in `remediator.busy_dir`. The marker is refreshed while the job runs (every
ttl/3) and removed when it ends; a crashed wrapper leaves a marker that simply expires. Exits with
the job's exit code (2 when the marker cannot be set: the job is not started unprotected).

A marker lost while the job runs (removed through the API or by hand, expired while the remediator
was unreachable, its state reset) is re-created at once, with a warning on stderr. When it cannot be
re-created (the remediator refuses, the marker folder is gone and cannot be written), the wrapper
stops loudly: it says so, terminates the job (SIGTERM) and exits 3. A job never keeps running
unprotected without a word. A refresh that merely cannot reach the remediator is retried while the
marker is still valid (its expiry has not passed since the last successful refresh).

The job dies with its wrapper: it is started with PR_SET_PDEATHSIG (Linux), so when the wrapper itself
is killed (kill -9, the OOM killer), the job gets SIGTERM at once, while its marker, no longer refreshed,
still holds for the rest of its ttl. SIGTERM, the signal the wrapper also stops a job with, lets a job
checkpoint and exit; a job that ignores it keeps running without protection once the marker expires.
Without the wrapper nobody would refresh the marker, and a job outliving it would run unprotected,
silently. (To stop a job, signal the wrapper: SIGTERM, SIGINT and SIGHUP are passed on to the job.)
"""

from __future__ import annotations

import argparse
import ctypes
import getpass
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Protocol

from llm_health.config import NAME_RE, ConfigError, load_config
from llm_health.http_client import FailureKind, HttpFailure, fetch
from llm_health.remediator.marker import write_marker_file

LOST_EXIT = 3
PR_SET_PDEATHSIG = 1          # <linux/prctl.h>
JOB_DEATH_SIGNAL = signal.SIGTERM


class MarkerLost(Exception):
    """The marker is gone (refresh answered 404 / the file is missing)."""


class MarkerHandle(Protocol):
    def refresh(self) -> None: ...          # raises MarkerLost when the marker no longer exists
    def recreate(self) -> str: ...          # a new marker; its description. Raises ConfigError/OSError
    def remove(self) -> None: ...


class ApiMarker:
    def __init__(self, url: str, backend: str, owner: str, ttl: float, token: str) -> None:
        self.url = url.rstrip("/")
        self.ttl = ttl
        self.backend = backend
        self.owner = owner
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.id = self._create()

    def _create(self) -> str:
        resp = fetch("POST", f"{self.url}/api/busy", timeout=10, headers=self.headers,
                     json_body={"backend": self.backend, "owner": self.owner, "ttl_seconds": self.ttl})
        if resp.status != 201:
            raise ConfigError(f"remediator refused the busy marker: {resp.status} {resp.text[:200]}")
        return str(resp.json()["id"])

    def refresh(self) -> None:
        resp = fetch("PUT", f"{self.url}/api/busy/{self.id}", timeout=10, headers=self.headers,
                     json_body={"ttl_seconds": self.ttl})
        if resp.status == 404:
            raise MarkerLost(f"marker {self.id} no longer exists on the remediator")
        if resp.status != 200:
            raise HttpFailure(FailureKind.ERROR, f"refresh answered {resp.status} {resp.text[:200]}", resp.status)

    def recreate(self) -> str:
        self.id = self._create()
        return f"marker {self.id}"

    def remove(self) -> None:
        fetch("DELETE", f"{self.url}/api/busy/{self.id}", headers=self.headers, timeout=10)


class FileMarker:
    def __init__(self, busy_dir: Path, backend: str, ttl: float) -> None:
        self.busy_dir, self.backend, self.ttl = busy_dir, backend, ttl
        self.path = write_marker_file(busy_dir, backend, ttl, f"{socket.gethostname()}-{os.getpid()}")

    def refresh(self) -> None:
        try:
            os.utime(self.path)
        except FileNotFoundError:
            raise MarkerLost(f"marker file {self.path} was removed") from None

    def recreate(self) -> str:
        self.path = write_marker_file(self.busy_dir, self.backend, self.ttl,
                                      f"{socket.gethostname()}-{os.getpid()}")
        return f"marker file {self.path}"

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", required=True, help="backend name from the config")
    parser.add_argument("--ttl", type=float, default=600.0, help="marker lifetime in seconds, refreshed every ttl/3")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--remediator", metavar="URL", help="set the marker through the remediator's API")
    where.add_argument("--config", help="llm-health config: a marker file in remediator.busy_dir")
    parser.add_argument("--token-file", help="bearer token for the remediator API")
    parser.add_argument("--owner", help="who holds the marker (default user@host: command)")
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the batch job to run")


def _token(path: str | None) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--token-file: cannot read {path}: {exc.strerror}") from exc


def open_marker(args: argparse.Namespace, owner: str) -> MarkerHandle:
    if args.remediator:
        try:
            return ApiMarker(args.remediator, args.backend, owner, args.ttl, _token(args.token_file))
        except HttpFailure as exc:
            raise ConfigError(f"cannot reach the remediator at {args.remediator}: {exc}") from exc
    config = load_config(args.config)
    if config.backend(args.backend) is None:
        if not config.discovery.enabled:
            raise ConfigError(f"--backend: {args.backend!r} is not in {args.config}")
        # a discovered backend is not in the file: any valid name may be marked (a marker protects)
        if NAME_RE.fullmatch(args.backend) is None:
            raise ConfigError(f"--backend: {args.backend!r} must match {NAME_RE.pattern}")
    if not config.remediator.busy_dir:
        raise ConfigError("remediator.busy_dir is not set in the config; use --remediator URL")
    if args.ttl > config.remediator.marker_max_ttl:
        raise ConfigError(f"--ttl: {args.ttl:g}s is over remediator.marker_max_ttl "
                          f"({config.remediator.marker_max_ttl:g}s)")
    busy_dir = config.resolve_path(config.remediator.busy_dir)
    try:
        return FileMarker(busy_dir, args.backend, args.ttl)
    except OSError as exc:
        raise ConfigError(f"cannot write a marker in {busy_dir}: {exc.strerror}") from exc


def die_with_this_process(sig: int = JOB_DEATH_SIGNAL) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `sig` when this process dies (Linux PR_SET_PDEATHSIG); None
    elsewhere. libc is looked up here, before the fork: the child only calls prctl and getppid. The
    death signal is tied to the thread that forks: call Popen from the main thread."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:        # the parent died before prctl took effect: no signal would come
            os.kill(os.getpid(), sig)

    return preexec


def run(args: argparse.Namespace) -> int:
    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no command given: llm-health busy --backend NAME ... -- COMMAND ...")
    if not 0 < args.ttl <= 7 * 24 * 3600:
        raise ConfigError("--ttl: must be in (0, 604800] seconds")
    owner = args.owner or f"{getpass.getuser()}@{socket.gethostname()}: {' '.join(command)[:120]}"
    marker = open_marker(args, owner)
    stop = threading.Event()
    lost = threading.Event()
    job: subprocess.Popen[bytes] | None = None

    def give_up(why: str) -> None:
        print(f"llm-health busy: ERROR: the busy marker for {args.backend} is lost and cannot be re-created "
              f"({why}); stopping the job rather than running it unprotected", file=sys.stderr, flush=True)
        lost.set()
        if job is not None and job.poll() is None:
            job.terminate()

    def refresher() -> None:
        last_ok = time.monotonic()
        while not stop.wait(args.ttl / 3):
            try:
                marker.refresh()
                last_ok = time.monotonic()
                continue
            except MarkerLost as exc:
                reason = str(exc)
            except (OSError, HttpFailure) as exc:
                if time.monotonic() - last_ok < args.ttl:
                    print(f"llm-health busy: marker refresh failed (retrying; the marker is valid until its "
                          f"ttl runs out): {exc}", file=sys.stderr, flush=True)
                    continue
                reason = f"no successful refresh for {args.ttl:g}s, it has expired: {exc}"
            try:
                what = marker.recreate()
            except (OSError, ConfigError, HttpFailure) as exc:
                give_up(f"{reason}; re-creating failed: {exc}")
                return
            last_ok = time.monotonic()
            print(f"llm-health busy: WARNING: the busy marker was lost ({reason}); re-created as {what}",
                  file=sys.stderr, flush=True)

    thread = threading.Thread(target=refresher, daemon=True)
    try:
        try:
            # forked before the refresher thread starts: a preexec_fn is only safe in a process of one thread
            job = subprocess.Popen(command, preexec_fn=die_with_this_process())
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"llm-health busy: cannot run {command[0]!r}: {getattr(exc, 'strerror', None) or exc}",
                  file=sys.stderr)
            return 127
        thread.start()

        def forward(signum: int, _frame: FrameType | None) -> None:
            job.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        code = job.wait()
        if lost.is_set():
            return LOST_EXIT
        return code if code >= 0 else 128 - code
    finally:
        stop.set()
        try:
            marker.remove()
        except (OSError, HttpFailure) as exc:
            print(f"llm-health busy: could not remove the marker (it expires by itself): {exc}", file=sys.stderr)
