"""gunicorn's control socket is off with a real `llm-health remediator`: nothing is created in $HOME
(~/.gunicorn/) or $XDG_RUNTIME_DIR (gunicorn.ctl), where gunicorn >= 25.1 puts it by default.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_health.procs import ManagedProcess, free_port, llm_health, wait_until

TOKEN = "slow-clients-token"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Served:
    url: str
    port: int
    proc: ManagedProcess
    home: Path
    runtime: Path


def write_config(tmp: Path, **remediator: Any) -> Path:
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
def serving(tmp: Path, *flags: Any, runtime_dir: bool = False, **remediator: Any) -> Iterator[Served]:
    """A real remediator with HOME (and XDG_RUNTIME_DIR, if `runtime_dir`, else unset) pointed at empty
    folders of its own: gunicorn's control socket would go to $XDG_RUNTIME_DIR, else to ~/.gunicorn/."""
    home, runtime = tmp / "home", tmp / "runtime"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", write_config(tmp, **remediator),
                                     "--listen", f"127.0.0.1:{port}", *flags),
                          name="remediator", log_dir=tmp, cwd=REPO,
                          env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime) if runtime_dir else ""})
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield Served(f"http://127.0.0.1:{port}", port, proc, home, runtime)
    finally:
        proc.stop()


@pytest.mark.parametrize("runtime_dir", [False, True], ids=["HOME", "XDG_RUNTIME_DIR"])
def test_no_control_socket(tmp_path: Path, runtime_dir: bool) -> None:
    with serving(tmp_path, "--workers", 1, runtime_dir=runtime_dir) as s:
        # gunicorn starts its control socket after the first workers, just before its main loop; a SIGHUP
        # is handled in that loop ("Hang up"), so once it is logged the socket would exist
        os.kill(s.proc.pid, signal.SIGHUP)
        wait_until(lambda: "Hang up" in s.proc.log(), timeout=20, what="the master in its main loop")
        assert list(s.home.rglob("*")) == [] and list(s.runtime.rglob("*")) == []   # no gunicorn.ctl, no .gunicorn/
        assert "control socket" not in s.proc.log().lower()
        s.proc.wait_http(s.url + "/healthz", timeout=30)
