"""A real Alertmanager (Debian's prometheus-alertmanager) on a free loopback port, for the e2e tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_health.drill.procs import ManagedProcess, free_port

AM_BINARY = shutil.which("prometheus-alertmanager")


@contextmanager
def running_alertmanager(config: Path, folder: Path, *, cluster: bool = False,
                         timeout: float = 20.0) -> Iterator[str]:
    """Alertmanager with `config`, its data and log in `folder`; yields its URL once /-/ready answers,
    stops it afterwards. `cluster`: listen for peers on a free loopback port (off: a lone instance)."""
    assert AM_BINARY is not None, "prometheus-alertmanager not installed (make debs)"
    port = free_port()
    peers = f"127.0.0.1:{free_port()}" if cluster else ""
    proc = ManagedProcess([AM_BINARY, f"--config.file={config}", f"--storage.path={folder / 'am-data'}",
                           f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address={peers}",
                           "--log.level=warn"], name="alertmanager", log_dir=folder)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/-/ready", timeout=timeout)
        yield url
    finally:
        proc.stop()
