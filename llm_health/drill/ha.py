"""Several remediators on one state, for the HA test and the failover benchmark (docs/ha.md).

* `Member`: one `llm-health remediator` process (1 worker) with its own folder, config and token;
  `leads()` reads its /healthz `holds_lease`; `deliver()` posts a notification to its webhook;
* `one_leader()`: wait until exactly one member leads;
* `restart_alert()`: the notification an Alertmanager sends about one backend's firing restart alert;
* `recorder_argv()` / `restarts()`: a restart action that appends "<backend> <epoch>" to a file (the epoch
  its process got in LLM_HEALTH_EPOCH), and the lines it wrote: a repeated restart shows there.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until

RECORDER = ("import os, sys\nwith open(sys.argv[1], 'a') as f:\n"
            "    f.write(f\"{os.environ['LLM_HEALTH_BACKEND']} {os.environ['LLM_HEALTH_EPOCH']}\\n\")\n")


def restart_alert(backend: str, starts_at: str = "2026-12-03T10:00:00Z") -> dict[str, Any]:
    """A webhook notification of one firing LLMBackendStalled (remediation=restart) about `backend`, grouped
    by backend as the shipped restart route groups it; the same dict every time (a repeat, an HA copy)."""
    return {"version": "4", "status": "firing", "receiver": "llm-health-remediator", "truncatedAlerts": 0,
            "groupKey": f'{{}}:{{backend="{backend}"}}', "groupLabels": {"backend": backend}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://am-0:9093",
            "alerts": [{"status": "firing", "labels": {"alertname": "LLMBackendStalled", "backend": backend,
                                                       "remediation": "restart", "severity": "critical"},
                        "annotations": {}, "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z",
                        "fingerprint": f"f-{backend}", "generatorURL": ""}]}


def recorder_argv(folder: Path, actions: Path) -> list[str]:
    """The restart action's argv: a script in `folder` appending "<backend> <epoch>" to `actions`."""
    script = folder / "restart.py"
    script.write_text(RECORDER)
    return [sys.executable, str(script), str(actions)]


def restarts(actions: Path) -> list[str]:
    """The restarts the recorder saw, oldest first ("<backend> <epoch>")."""
    return actions.read_text().splitlines() if actions.exists() else []


class Member:
    def __init__(self, folder: Path, config: dict[str, Any], token: str) -> None:
        folder.mkdir()
        (folder / "token").write_text(token + "\n")
        os.chmod(folder / "token", 0o600)
        (folder / "llm-health.yml").write_text(yaml.safe_dump(config))
        self.folder = folder
        self.name = folder.name
        self.headers = {"Authorization": f"Bearer {token}"}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = self.start()

    def start(self) -> ManagedProcess:
        """The process (again, after a kill), once its /healthz answers."""
        proc = ManagedProcess(llm_health("remediator", "--config", self.folder / "llm-health.yml", "--listen",
                                         f"127.0.0.1:{self.port}", "--workers", 1), name=self.name,
                              log_dir=self.folder, cwd=self.folder)
        proc.wait_http(self.url + "/healthz", timeout=60)
        return proc

    def health(self) -> dict[str, Any] | None:
        try:
            return dict(requests.get(self.url + "/healthz", timeout=2).json())
        except (requests.RequestException, ValueError):
            return None

    def leads(self) -> bool:
        h = self.health()
        return bool(h and h.get("holds_lease"))

    def deliver(self, notification: dict[str, Any]) -> int:
        """POST a notification to its webhook: the status code (0: no answer)."""
        try:
            return requests.post(self.url + "/webhook", json=notification, headers=self.headers, timeout=10).status_code
        except requests.RequestException:
            return 0

    def signal(self, signum: int) -> None:
        os.killpg(self.proc.proc.pid, signum)

    def stop(self) -> None:
        """Stopped, even when frozen (SIGCONT first, so it can take its SIGTERM)."""
        try:
            self.signal(signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.stop()


def leaders(members: Sequence[Member]) -> list[Member]:
    return [m for m in members if m.leads()]


def one_leader(members: Sequence[Member], timeout: float, what: str = "exactly one leader") -> Member:
    def found() -> Member | None:
        now = leaders(members)
        return now[0] if len(now) == 1 else None
    return wait_until(found, timeout=timeout, interval=0.05, what=what)
