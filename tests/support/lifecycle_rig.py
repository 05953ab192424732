"""A real remediator (gunicorn, 2 workers, its agent-check listener) over in-process simulators, with a real
HAProxy 2.6 in front when asked (config derived from deploy/haproxy/haproxy.cfg, agent pointing at the
remediator). Restart actions record their start and end in actions.txt and restart the simulator through
`python -m llm_health.simulator.ctl restart`. Shared by the lifecycle and operator-command tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.haproxy import render_config
from tests.support.paths import REPO
from tests.support.remediator_process import TOKEN, RemediatorRig

HAPROXY = shutil.which("haproxy")

RECORDER = '''
import os, subprocess, sys, time
log, ctl = sys.argv[1], sys.argv[2]
name = os.environ["LLM_HEALTH_BACKEND"]
with open(log, "a") as f:
    f.write(f"start {name} {time.time():.6f}\\n")
code = subprocess.call([sys.executable, "-m", "llm_health.simulator.ctl", "restart", ctl],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(log, "a") as f:
    f.write(f"end {name} {time.time():.6f}\\n")
sys.exit(code)
'''


def build_rig(tmp: Path, hosts: dict[str, str], lb: bool, **settings: Any) -> RemediatorRig:
    sims: dict[str, Simulator] = {}
    proc = haproxy = None
    try:
        for name in hosts:
            sims[name] = Simulator(SimConfig(port=free_port(), control_port=free_port(), model=name,
                                             restart_seconds=0.3, step_seconds=0.005)).start()
        for sim in sims.values():
            wait_until(lambda sim=sim: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
        (tmp / "token").write_text(TOKEN)
        (tmp / "record.py").write_text(RECORDER)
        port, agent_port = free_port(), free_port()
        socket_path = str(tmp / "admin.sock")
        cfg = {
            "backends": [{"name": n, "url": s.url, "host": hosts[n], "model": n,
                          "restart": [sys.executable, str(tmp / "record.py"), str(tmp / "actions.txt"),
                                      str(s.control_url)]} for n, s in sims.items()],
            "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
            "remediator": {
                "listen": f"127.0.0.1:{port}", "state": "state.db", "token_file": "token", "workers": 2,
                "agent_listen": f"127.0.0.1:{agent_port}", "verify_readings": 2, "verify_interval": 0.2,
                "poll_interval": 0.1, "warmup_poll": 0.2, "warmup_timeout": 20, "action_timeout": 20,
                "drain_timeout": 20, "stalled_drain_timeout": 0.3, "dedup_window": 60,
                **({"haproxy_socket": socket_path} if lb else {}),
                **settings,
            },
        }
        (tmp / "llm-health.yml").write_text(yaml.safe_dump(cfg))
        proc = ManagedProcess(llm_health("remediator", "--config", tmp / "llm-health.yml"), name="remediator",
                              log_dir=tmp, cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/healthz", timeout=30)
        rig = RemediatorRig(url, tmp, proc, sims, agent_port)
        rig.wait(lambda: set(rig.lifecycle().values()) == {"ready"}, "every backend READY")
        rig.mark = max(e["id"] for e in rig.events())
        if lb:
            fe_port = free_port()
            (tmp / "haproxy.cfg").write_text(render_config(fe_port, socket_path, agent_port, sims))  # type: ignore[arg-type]
            haproxy = ManagedProcess([HAPROXY or "haproxy", "-db", "-f", str(tmp / "haproxy.cfg")], name="haproxy", log_dir=tmp)
            rig.haproxy, rig.lb_url, rig.socket_path = haproxy, f"http://127.0.0.1:{fe_port}", socket_path

            def up() -> bool:
                if not haproxy.alive():
                    raise RuntimeError(haproxy.log())
                st = rig.stats()
                return len(st) == len(sims) and all(s.status == "UP" for s in st.values())

            rig.wait(up, "HAProxy sees every server UP")
        return rig
    except BaseException:
        for p in (haproxy, proc):
            if p is not None:
                p.stop()
        for sim in sims.values():
            sim.stop()
        raise
