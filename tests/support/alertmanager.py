"""A real Alertmanager (Debian's prometheus-alertmanager) on a free loopback port, for the e2e tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from llm_health.drill.procs import ManagedProcess, free_port
from tests.support.paths import REPO

AM_BINARY = shutil.which("prometheus-alertmanager")
AM_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


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


def shipped_config_to(remediators: Sequence[str], token: str, folder: Path) -> dict[str, Any]:
    """The shipped deploy/alertmanager/alertmanager.yml with its remediator receiver sending to every URL
    in `remediators` (with `token`, written to folder/remediator.token); the caller adjusts the routes."""
    config = yaml.safe_load(AM_CONFIG.read_text())
    token_file = folder / "remediator.token"
    token_file.write_text(token + "\n")
    (receiver,) = [r for r in config["receivers"] if r["name"] == "llm-health-remediator"]
    (hook,) = receiver["webhook_configs"]
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    receiver["webhook_configs"] = [{**hook, "url": f"{url}/webhook"} for url in remediators]
    return dict(config)
