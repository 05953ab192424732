"""A throw-away PostgreSQL server (Debian's `postgresql`) for the tests and benchmarks: `initdb` in a
temporary folder, `pg_ctl` on a free loopback port, fresh databases on demand, stopped and removed after.

Binaries: on PATH, else the newest /usr/lib/postgresql/*/bin (Debian keeps them there); `require_postgres`
skips a test locally when they are missing and fails it under CI=true (scripts/ensure-debs.sh installs the
package). As root the server runs as the `postgres` user (PostgreSQL refuses to run as root). Durability is
off (fsync=off): what is measured is our behaviour, not the disk's. Never for production state.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from llm_health.drill.procs import free_port

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
USER = "llmhealth"
_names = itertools.count(1)


def bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        real = Path(found).resolve().parent           # a symlink on PATH: the server's own bin folder
        if all((real / b).exists() for b in ("pg_ctl", "createdb")):
            return real
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if all((Path(d) / b).exists() for b in ("initdb", "pg_ctl", "createdb")):
            return Path(d)
    return None


MISSING = "PostgreSQL (initdb, pg_ctl) not installed: run `make debs` (Debian package postgresql)"


def require_postgres() -> Path:
    """The binaries' folder; in a test run without them: skip, or fail under CI=true."""
    found = bin_dir()
    if found is None:
        import pytest

        if IN_CI:
            pytest.fail("CI: " + MISSING, pytrace=False)
        pytest.skip(MISSING)
    return found


def _as_server_user() -> list[str]:
    """The prefix that runs a command as the `postgres` user when we are root (else nothing)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", "--"]


@dataclass
class PostgresServer:
    bin: Path
    folder: Path
    port: int = 0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.folder / "postgres.log"

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def _run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*_as_server_user(), *argv], capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=self.folder)

    def initdb(self) -> None:
        r = self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                      "--no-sync", "--no-instructions")
        assert r.returncode == 0, r.stdout + r.stderr
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\nlisten_addresses = '127.0.0.1'\nfsync = off\nsynchronous_commit = off\n"
                       "full_page_writes = off\nmax_connections = 200\nshared_buffers = 16MB\n"
                       f"unix_socket_directories = '{self.folder}'\n")

    def start(self, timeout: float = 60.0) -> None:
        if not self.port:
            self.port = free_port()
        r = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                      "-t", str(int(timeout)), "-o", f"-p {self.port}", "start", timeout=timeout + 10)
        assert r.returncode == 0, r.stdout + r.stderr + self.log_tail()

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "status").returncode == 0

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """A fresh, empty database (Debian's `createdb`: no SQL here, the store is the only room that speaks
        it); its URL."""
        name = f"t{os.getpid()}_{next(_names)}_{int(time.monotonic() * 1000) % 100000}"
        r = subprocess.run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                            "-T", "template0", name], capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        return self.url(name)


@contextmanager
def postgres_server(bin_path: Path | None = None) -> Iterator[PostgresServer]:
    """A running server in a new temporary folder (owned by the server's user), stopped and removed after."""
    bin_path = bin_path or require_postgres()
    folder = Path(tempfile.mkdtemp(prefix="llmh-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    server = PostgresServer(bin_path, folder)
    try:
        server.initdb()
        server.start()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)
