"""`llm-health busy --backend NAME [--ttl S] [--remediator URL | --config FILE] -- COMMAND ...`

Runs a batch job with a busy marker set for a backend: through the remediator's API when a URL is
given, else as a file in `remediator.busy_dir`. The marker is refreshed while the job runs (every
ttl/3) and removed when it ends; a crashed wrapper leaves a marker that simply expires. Exits with
the job's exit code (2 when the marker cannot be set: the job is not started unprotected).
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Protocol

import requests
from llm_health.remediator.marker import write_marker_file

from llm_health.config import ConfigError, load_config


class MarkerHandle(Protocol):
    def refresh(self) -> None: ...
    def remove(self) -> None: ...


class ApiMarker:
    def __init__(self, url: str, backend: str, owner: str, ttl: float, token: str) -> None:
        self.url = url.rstrip("/")
        self.ttl = ttl
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        resp = requests.post(f"{self.url}/api/busy", json={"backend": backend, "owner": owner, "ttl_seconds": ttl},
                             headers=self.headers, timeout=10)
        if resp.status_code != 201:
            raise ConfigError(f"remediator refused the busy marker: {resp.status_code} {resp.text[:200]}")
        self.id = resp.json()["id"]

    def refresh(self) -> None:
        requests.put(f"{self.url}/api/busy/{self.id}", json={"ttl_seconds": self.ttl}, headers=self.headers,
                     timeout=10)

    def remove(self) -> None:
        requests.delete(f"{self.url}/api/busy/{self.id}", headers=self.headers, timeout=10)


class FileMarker:
    def __init__(self, busy_dir: Path, backend: str, ttl: float) -> None:
        self.path = write_marker_file(busy_dir, backend, ttl, f"{socket.gethostname()}-{os.getpid()}")

    def refresh(self) -> None:
        os.utime(self.path)

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
        except requests.RequestException as exc:
            raise ConfigError(f"cannot reach the remediator at {args.remediator}: {exc}") from exc
    config = load_config(args.config)
    if config.backend(args.backend) is None:
        raise ConfigError(f"--backend: {args.backend!r} is not in {args.config}")
    if not config.remediator.busy_dir:
        raise ConfigError("remediator.busy_dir is not set in the config; use --remediator URL")
    busy_dir = config.resolve_path(config.remediator.busy_dir)
    try:
        return FileMarker(busy_dir, args.backend, args.ttl)
    except OSError as exc:
        raise ConfigError(f"cannot write a marker in {busy_dir}: {exc.strerror}") from exc


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

    def refresher() -> None:
        while not stop.wait(args.ttl / 3):
            try:
                marker.refresh()
            except (OSError, requests.RequestException) as exc:
                print(f"llm-health busy: marker refresh failed: {exc}", file=sys.stderr)

    thread = threading.Thread(target=refresher, daemon=True)
    thread.start()
    try:
        try:
            job = subprocess.Popen(command)
        except OSError as exc:
            print(f"llm-health busy: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127

        def forward(signum: int, _frame: FrameType | None) -> None:
            job.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        code = job.wait()
        return code if code >= 0 else 128 - code
    finally:
        stop.set()
        try:
            marker.remove()
        except (OSError, requests.RequestException) as exc:
            print(f"llm-health busy: could not remove the marker (it expires by itself): {exc}", file=sys.stderr)
