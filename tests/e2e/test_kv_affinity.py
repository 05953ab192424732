"""KV-aware session affinity end to end, with no hand-set statuses (issue 7).

Two in-process simulators, a real `llm-health remediator` with `agent_listen` set (its agent answers HAProxy
from SQLite and reads each backend's KV-cache usage from that backend's own /metrics), and a real HAProxy
whose backend section comes from deploy/haproxy/haproxy.cfg (`balance hdr(X-Session-Id)`, consistent hash,
bounded load), its agent-check pointed at the remediator.

One simulator is filled for real: a single long request (a ~62k-token prompt, ~1k tokens to generate) sent
straight to it, not through HAProxy (so HAProxy's bounded-load counting plays no part), takes over 97 % of
its KV blocks for the whole test while leaving room for small requests. The agent lowers its weight
(`ready up W%`), HAProxy applies it, and new sessions mostly go to the other simulator.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.remediator.drain import ServerStat, show_stat
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.haproxy import render_config
from tests.support.paths import REPO

HAPROXY = shutil.which("haproxy")
NAMES = ("gpu-a", "gpu-b")
FULL, OTHER = "gpu-a", "gpu-b"
KV_BLOCKS, BLOCK_SIZE = 4000, 16
FILL_PROMPT_TOKENS = int(KV_BLOCKS * 0.975) * BLOCK_SIZE     # 97.5 % of the KV blocks once prefilled
FILL_MAX_TOKENS = int(KV_BLOCKS * 0.015) * BLOCK_SIZE        # grows to 99 % at the very end (~19 s)
SESSIONS = 200

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(HAPROXY is None, reason="haproxy not installed")]


@dataclass
class FullPath:
    url: str
    lb_url: str
    socket_path: str
    sims: dict[str, Simulator]
    procs: list[ManagedProcess] = field(default_factory=list)

    def stats(self) -> dict[str, ServerStat]:
        return {srv: st for (px, srv), st in show_stat(self.socket_path).items() if px == "vllm"}

    def lifecycle(self) -> dict[str, str]:
        rows = requests.get(f"{self.url}/api/backends", timeout=5).json()["backends"]
        return {b["backend"]: b["lifecycle"]["state"] for b in rows}

    def served_by(self, session: str) -> str:
        resp = requests.post(self.lb_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                             headers={"X-Session-Id": session}, timeout=10)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["model"])

    def at_rest(self) -> None:
        wait_until(lambda: all(st.current_sessions == 0 for st in self.stats().values()),
                   timeout=10, interval=0.01, what="no request in flight in HAProxy")


def kv_usage(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:kv_cache_usage_perc":
                return float(s.value)
    raise KeyError("vllm:kv_cache_usage_perc")


@pytest.fixture
def full_path(tmp_path: Path) -> Iterator[FullPath]:
    sims: dict[str, Simulator] = {}
    procs: list[ManagedProcess] = []
    try:
        for name in NAMES:
            sims[name] = Simulator(SimConfig(port=free_port(), model=name, kv_blocks=KV_BLOCKS,
                                             block_size=BLOCK_SIZE, chunk_tokens=16384,
                                             step_seconds=0.02)).start()
        for sim in sims.values():
            wait_until(lambda sim=sim: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
        (tmp_path / "token").write_text("kv-fullpath-token")
        port, agent_port = free_port(), free_port()
        cfg = {
            "backends": [{"name": n, "url": s.url, "host": f"node-{n}", "model": n} for n, s in sims.items()],
            "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
            "remediator": {"listen": f"127.0.0.1:{port}", "state": "state.db", "token_file": "token",
                           "workers": 1, "agent_listen": f"127.0.0.1:{agent_port}", "poll_interval": 0.1,
                           "warmup_poll": 0.2},
        }
        (tmp_path / "llm-health.yml").write_text(yaml.safe_dump(cfg))
        remediator = ManagedProcess(llm_health("remediator", "--config", tmp_path / "llm-health.yml"),
                                    name="remediator", log_dir=tmp_path, cwd=REPO)
        procs.append(remediator)
        url = f"http://127.0.0.1:{port}"
        remediator.wait_http(url + "/healthz", timeout=30)
        fe_port = free_port()
        socket_path = str(tmp_path / "admin.sock")
        (tmp_path / "haproxy.cfg").write_text(render_config(fe_port, socket_path, agent_port, sims))  # type: ignore[arg-type]
        haproxy = ManagedProcess([HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")], name="haproxy",
                                 log_dir=tmp_path)
        procs.append(haproxy)
        rig = FullPath(url, f"http://127.0.0.1:{fe_port}", socket_path, sims, procs)
        wait_until(lambda: rig.lifecycle() == dict.fromkeys(NAMES, "ready"), timeout=30, what="both READY")

        def up() -> bool:
            if not haproxy.alive():
                raise RuntimeError(haproxy.log())
            st = rig.stats()
            return len(st) == 2 and all(s.status == "UP" and s.weight == 100 for s in st.values())

        wait_until(up, timeout=15, interval=0.05, what="HAProxy: both UP, weight 100 (agent answers ready up 100%)")
        yield rig
    finally:
        for p in reversed(procs):
            p.stop()
        for sim in sims.values():
            sim.stop()


def fill_kv(sim: Simulator) -> threading.Thread:
    body: dict[str, Any] = {"prompt": [7] * FILL_PROMPT_TOKENS, "max_tokens": FILL_MAX_TOKENS}

    def run() -> None:
        try:
            requests.post(sim.url + "/v1/completions", json=body, timeout=60)
        except requests.RequestException:
            pass                                          # the simulator stops under it at teardown

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_kv_saturated_backend_gets_fewer_new_sessions_through_the_real_agent(full_path: FullPath) -> None:
    rig = full_path
    assert kv_usage(rig.sims[FULL].url) < 0.05 and kv_usage(rig.sims[OTHER].url) < 0.05
    before = Counter(rig.served_by(f"kv-before-{i}") for i in range(SESSIONS))
    assert min(before[n] for n in NAMES) > SESSIONS // 5, f"equal weights should share sessions: {dict(before)}"

    fill_kv(rig.sims[FULL])
    wait_until(lambda: kv_usage(rig.sims[FULL].url) > 0.97, timeout=10, what=f"{FULL} KV-saturated")
    assert kv_usage(rig.sims[OTHER].url) < 0.05
    weight = wait_until(lambda: (lambda w: w if w <= 30 else None)(rig.stats()[FULL].weight), timeout=15,
                        interval=0.05, what=f"HAProxy applies the agent's lowered weight of {FULL}")
    assert rig.stats()[OTHER].weight == 100 and rig.stats()[FULL].status == "UP"
    rig.at_rest()

    after = Counter(rig.served_by(f"kv-after-{i}") for i in range(SESSIONS))
    kv_end, weight_end = kv_usage(rig.sims[FULL].url), rig.stats()[FULL].weight
    numbers = (f"sessions per server: equal weights {dict(before)}; {FULL} at KV >0.97 (weight {weight} -> "
               f"{weight_end}, KV {kv_end:.3f} at the end) {dict(after)}")
    print(numbers)
    assert kv_end > 0.97 and weight_end <= 30, f"the saturation must last the whole run: {numbers}"
    assert rig.sims[FULL].stats_json()["running"] >= 1, numbers       # the filler is still in flight
    assert sum(after.values()) == SESSIONS and after[FULL] > 0, numbers  # still UP, just weighted down
    assert after[FULL] * 3 < after[OTHER], f"the KV-saturated {FULL} should get far fewer sessions: {numbers}"
    assert after[FULL] < before[FULL], numbers
    assert rig.lifecycle() == dict.fromkeys(NAMES, "ready"), "no status was hand-set: both stay READY"
