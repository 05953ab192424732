"""A real `llm-health remediator` (gunicorn) on loopback for process tests: its config file, token and
state in the test's folder; `stop()` always reaps it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health

TOKEN = "t0ken"


class Remediator:
    def __init__(self, workdir: Path, data: dict[str, Any], *flags: Any, workers: int = 1, name: str = "remediator",
                 port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        token = workdir / "token"
        token.write_text(TOKEN + "\n")
        os.chmod(token, 0o600)
        self.config_path = workdir / "llm-health.yml"
        self.write_config(data)
        self.proc = ManagedProcess(llm_health("remediator", "--config", self.config_path, "--listen",
                                              f"127.0.0.1:{self.port}", "--workers", workers, *flags),
                                   name=name, log_dir=workdir)

    def write_config(self, data: dict[str, Any]) -> None:
        remediator = {"state": "state.db", "token_file": "token", "poll_interval": 0.2, **data.get("remediator", {})}
        self.config_path.write_text(yaml.safe_dump({**data, "remediator": remediator}, sort_keys=False))

    def wait_ready(self, timeout: float = 30.0) -> Remediator:
        self.proc.wait_http(self.url + "/healthz", timeout=timeout)
        return self

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.url + path, timeout=15, **kwargs)

    def post(self, path: str, body: Any) -> requests.Response:
        return requests.post(self.url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15)

    def stop(self) -> None:
        self.proc.stop()
