"""A real `llm-health remediator` process, for the process and end-to-end tests.

* `write_config(tmp, **settings)`: a configuration with one backend (gpu-a, on a closed port, restart
  action `true`) and the token file (mode 600) beside it;
* `running(tmp, workers, **settings)`: that configuration served by a real remediator under gunicorn;
* `Remediator`: one remediator process with its config file (rewritable, for reloads) and token;
* `RemediatorRig`: a running remediator seen through its API (webhook, events, lifecycle), the
  simulators its restart actions restart (their start and end recorded in `actions.txt`), and HAProxy
  when the test puts one in front of them; `stop_rig()` stops them all.

The tests start the processes themselves (their settings differ); these are the parts two modules share.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.remediator.drain import ServerStat, show_stat
from llm_health.simulator.server import Simulator

TOKEN = "remediator-process-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def write_config(tmp: Path, **remediator: object) -> Path:
    (tmp / "token").write_text(TOKEN + "\n")
    os.chmod(tmp / "token", 0o600)
    cfg = {
        "backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}", "restart": ["true"]}],
        "remediator": {"state": "state.db", "token_file": "token", "poll_interval": 0.2, **remediator},
    }
    path = tmp / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextmanager
def running(tmp: Path, workers: int, **remediator: object) -> Iterator[tuple[str, ManagedProcess]]:
    """`write_config(tmp, **remediator)` served by `llm-health remediator --workers N` on a free port:
    (its URL, its process), stopped afterwards."""
    port = free_port()
    config = write_config(tmp, **remediator)
    proc = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                     "--workers", workers), name="remediator", log_dir=tmp)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()


@dataclass
class RemediatorRig:
    """A real remediator process (its URL, its folder), the in-process simulators it restarts, and, when
    the test starts one, the HAProxy in front of them."""

    url: str
    tmp: Path
    proc: ManagedProcess
    sims: dict[str, Simulator]
    agent_port: int
    lb_url: str = ""
    socket_path: str = ""
    haproxy: ManagedProcess | None = None
    mark: int = 0                      # audit events up to this id belong to the start-up
    stuck: list[threading.Thread] = field(default_factory=list)

    # -- remediator
    def post(self, body: Any) -> None:
        requests.post(f"{self.url}/webhook", json=body, headers=AUTH, timeout=10).raise_for_status()

    def events(self, backend: str = "", kind: str = "") -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/events", params={"backend": backend, "kind": kind, "limit": 5000},
                         timeout=5)
        r.raise_for_status()
        return [e for e in reversed(r.json()["events"]) if e["id"] > self.mark]     # oldest first

    def lifecycle(self) -> dict[str, str]:
        r = requests.get(f"{self.url}/api/backends", timeout=5).json()["backends"]
        return {b["backend"]: b["lifecycle"]["state"] for b in r}

    def wait(self, cond: Any, what: str, timeout: float = 30.0) -> Any:
        try:
            return wait_until(cond, timeout=timeout, interval=0.05, what=what)
        except AssertionError:
            print(self.proc.log()[-3000:])
            for e in self.events()[-60:]:
                print(e["at"], e["kind"], e["backend"], e["reason"])
            raise

    def actions(self) -> list[tuple[str, str, float]]:
        path = self.tmp / "actions.txt"
        if not path.exists():
            return []
        return [(w[0], w[1], float(w[2])) for w in (ln.split() for ln in path.read_text().splitlines())]

    # -- simulators
    def stall_with_work(self, name: str) -> None:
        """One long request straight to the simulator, then freeze the engine: it stays in flight."""
        sim = self.sims[name]
        t = threading.Thread(target=_swallow, args=(sim.url + "/v1/completions",
                                                    {"prompt": "x", "max_tokens": 4000}), daemon=True)
        t.start()
        self.stuck.append(t)
        wait_until(lambda: sim.stats_json()["running"] >= 1, what=f"work running on {name}")
        sim.set_fault("stall")

    # -- HAProxy
    def stats(self) -> dict[str, ServerStat]:
        return {srv: st for (px, srv), st in show_stat(self.socket_path).items() if px == "vllm"}

    def complete(self, session: str | None = None, timeout: float = 10) -> requests.Response:
        headers = {"X-Session-Id": session} if session else {}
        return requests.post(self.lb_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                             headers=headers, timeout=timeout)

    def served_by(self, session: str | None = None) -> str:
        resp = self.complete(session)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["model"])


def _swallow(url: str, body: dict[str, Any]) -> None:
    try:
        requests.post(url, json=body, timeout=30)
    except requests.RequestException:
        pass


def stop_rig(rig: RemediatorRig) -> None:
    for p in (rig.haproxy, rig.proc):
        if p is not None:
            p.stop()
    for sim in rig.sims.values():
        sim.stop()


class Remediator:
    """A real remediator (gunicorn) on loopback: config, token and state in `workdir`; `stop()` reaps it."""

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
