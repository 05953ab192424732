"""A real Alertmanager (Debian's prometheus-alertmanager) on a free loopback port, for the e2e tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from llm_health.drill.procs import ManagedProcess, free_port

AM_BINARY = shutil.which("prometheus-alertmanager")


@contextmanager
def running_alertmanager(config: Path, folder: Path, *, cluster: bool = False, cluster_port: int = 0,
                         peers: Sequence[str] = (), timeout: float = 20.0, name: str = "alertmanager") -> Iterator[str]:
    """Alertmanager with `config`, its data and log in `folder`; yields its URL once /-/ready answers,
    stops it afterwards. `cluster`: listen for peers on loopback (`cluster_port`, else a free one) and join
    `peers` (host:port of the others' cluster ports); off: a lone instance."""
    assert AM_BINARY is not None, "prometheus-alertmanager not installed (make debs)"
    port = free_port()
    listen = f"127.0.0.1:{cluster_port or free_port()}" if cluster else ""
    flags = [f"--cluster.peer={p}" for p in peers]
    if cluster:
        flags += ["--cluster.pushpull-interval=2s", "--cluster.gossip-interval=100ms"]
    proc = ManagedProcess([AM_BINARY, f"--config.file={config}", f"--storage.path={folder / (name + '-data')}",
                           f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address={listen}",
                           *flags, "--log.level=warn"], name=name, log_dir=folder)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/-/ready", timeout=timeout)
        yield url
    finally:
        proc.stop()
