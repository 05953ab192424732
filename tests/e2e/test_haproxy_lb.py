"""A real HAProxy 2.6 process steered by our agent-check server, in front of two small HTTP backends.

The backend section's directives (balance, hash-type, hash-balance-factor, the 503 reply, the least-loaded
path for requests without a session, the queue bound, httpchk) and the servers' maxconn/maxqueue are taken
from the shipped deploy/haproxy/haproxy.cfg, so these tests exercise that file; only addresses and check
intervals are test-specific. Shedding and least-loaded placement under load: test_haproxy_shedding.py. Waiting is polling `show stat` on the stats socket with a deadline.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.remediator.agent_check import AgentCheckServer, AgentStatus
from llm_health.remediator.drain import ServerStat, parse_show_stat, show_stat
from llm_health.remediator.lifecycle import LifecycleState
from tests.support.haproxy import DEPLOY_CFG, Sim, backend_directives, render_config

S = LifecycleState
NAMES = ("gpu-a", "gpu-b")
HAPROXY = shutil.which("haproxy")

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(HAPROXY is None, reason="haproxy not installed")]


# --- the shipped config -------------------------------------------------------------------------------


def test_deploy_config_is_valid_and_has_the_documented_directives() -> None:
    result = subprocess.run([HAPROXY, "-c", "-f", str(DEPLOY_CFG)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    text = DEPLOY_CFG.read_text()
    directives = backend_directives(text)
    for expected in ("balance hdr(X-Session-Id)", "hash-type consistent", "hash-balance-factor 150",
                     "option httpchk GET /health"):
        assert expected in directives
    assert "bind :8080" in text and "stats socket" in text
    for name in ("gpu-a", "gpu-b"):
        assert f'server {name} ' in text and f'agent-send "{name}\\n"' in text
    assert "agent-port 9412" in text and "agent-inter 2s" in text


def test_parse_show_stat() -> None:
    text = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,weight,\n"
            "fe,FRONTEND,,,0,1,256,3,OPEN,,\n"
            "vllm,gpu-a,0,0,1,1,,7,DRAIN (agent),100,\n"
            "vllm,gpu-b,0,0,0,1,,9,UP,16,\n"
            "vllm,BACKEND,0,0,1,1,26,16,UP,116,\n")
    stats = parse_show_stat(text)
    assert [(s.server, s.status, s.weight, s.current_sessions, s.total_sessions) for s in stats] == [
        ("gpu-a", "DRAIN (agent)", 100, 1, 7), ("gpu-b", "UP", 16, 0, 9)]
    assert stats[0].draining and stats[1].up and not stats[1].down


# --- simulated backends: `llm-health sim`, one per name, its model named like the backend ----------------


# --- the HAProxy fixture --------------------------------------------------------------------------------

@dataclass
class LB:
    url: str
    socket_path: str
    table: dict[str, AgentStatus]
    backends: dict[str, Sim]

    def stats(self) -> dict[str, ServerStat]:
        return {srv: st for (px, srv), st in show_stat(self.socket_path).items() if px == "vllm"}

    def wait_for(self, name: str, predicate, what: str) -> ServerStat:  # noqa: ANN001
        return wait_until(lambda: (lambda st: st if predicate(st) else None)(self.stats()[name]),
                          timeout=15, interval=0.05, what=f"{name} {what} (now {self.stats().get(name)})")

    def set_status(self, name: str, status: AgentStatus) -> None:
        self.table[name] = status

    def all_ready(self) -> None:
        for name in NAMES:
            self.set_status(name, AgentStatus(S.READY, 0.1))
        for name in NAMES:
            self.wait_for(name, lambda st: st.status == "UP" and st.weight == 100, "UP with weight 100")

    def at_rest(self) -> None:
        """Wait until HAProxy counts no request on any server. Needed before a stickiness check: with
        hash-balance-factor 150 and one request still counted (HAProxy frees it just after the client
        has the answer), the first-choice server may be "full" and the next one on the ring is used."""
        wait_until(lambda: all(st.current_sessions == 0 for st in self.stats().values()),
                   timeout=10, interval=0.01, what="no request in flight in HAProxy")

    def complete(self, session: str | None, timeout: float = 10) -> requests.Response:
        """One small completion through the proxy; the simulator's model name says who answered."""
        headers = {"X-Session-Id": session} if session is not None else {}
        return requests.post(self.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                             headers=headers, timeout=timeout)

    def served_by(self, session: str | None) -> str:
        resp = self.complete(session)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["model"])


@pytest.fixture(scope="module")
def lb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LB]:
    tmp = tmp_path_factory.mktemp("haproxy")
    backends: dict[str, Sim] = {}
    table: dict[str, AgentStatus] = {name: AgentStatus(S.READY, 0.1) for name in NAMES}
    agent = AgentCheckServer("127.0.0.1", 0, table.get).start()
    proc: ManagedProcess | None = None
    try:
        for name in NAMES:
            port = free_port()
            argv = llm_health("sim", "--port", port, "--model", name, "--step-seconds", "0.005")
            backends[name] = Sim(name, port, ManagedProcess(argv, name=f"sim-{name}", log_dir=tmp))
        for sim in backends.values():
            sim.proc.wait_http(sim.url + "/health")
        fe_port = free_port()
        socket_path = str(tmp / "admin.sock")
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(render_config(fe_port, socket_path, agent.port, backends))
        proc = ManagedProcess([HAPROXY, "-db", "-f", str(cfg)], name="haproxy", log_dir=tmp)
        lb = LB(f"http://127.0.0.1:{fe_port}", socket_path, table, backends)

        def ready() -> bool:
            if not proc.alive():
                raise RuntimeError(f"haproxy exited:\n{proc.log()}")
            return all(st.status == "UP" for st in lb.stats().values()) and len(lb.stats()) == 2

        wait_until(ready, timeout=15, what="haproxy servers UP")
        yield lb
    finally:
        if proc is not None:
            proc.stop()
        agent.stop()
        for sim in backends.values():
            sim.proc.stop()


def sessions(n: int) -> list[str]:
    return [f"s-{uuid.uuid4().hex[:12]}" for _ in range(n)]


# --- behaviour ------------------------------------------------------------------------------------------

def test_same_session_sticks_to_one_server(lb: LB) -> None:
    lb.all_ready()
    seen: Counter[str] = Counter()
    for sid in sessions(20):
        servers = set()
        for _ in range(3):
            lb.at_rest()
            servers.add(lb.served_by(sid))
        assert len(servers) == 1, f"session {sid} moved between {servers}"
        seen[servers.pop()] += 1
    assert set(seen) == set(NAMES), f"20 sessions should spread over both servers: {seen}"


def test_proxy_health_path_and_no_header_spreads(lb: LB) -> None:
    lb.all_ready()
    got = {lb.served_by(None) for _ in range(6)}
    assert got == set(NAMES)          # no X-Session-Id: least loaded, and equal loads take turns
    models = requests.get(lb.url + "/v1/models", timeout=5)          # what the exporter checks on a proxy
    assert models.status_code == 200 and models.json()["data"][0]["id"] in NAMES


def test_kv_saturated_backend_gets_fewer_new_sessions(lb: LB) -> None:
    lb.all_ready()
    before = Counter(lb.served_by(sid) for sid in sessions(200))
    assert min(before[n] for n in NAMES) > 40, f"equal weights should share sessions: {before}"

    lb.set_status("gpu-a", AgentStatus(S.READY, 0.99))
    lb.wait_for("gpu-a", lambda st: st.status == "UP" and st.weight == 16, "weight 16 (kv 0.99)")
    after = Counter(lb.served_by(sid) for sid in sessions(200))
    print(f"sessions per server: equal weights {dict(before)}; gpu-a at kv 0.99 {dict(after)}")
    assert after["gpu-a"] * 3 < after["gpu-b"], f"saturated gpu-a should get far fewer sessions: {after}"


def test_drained_backend_gets_no_new_requests_and_finishes_in_flight(lb: LB) -> None:
    lb.all_ready()
    sticky = next(sid for sid in sessions(100) if lb.served_by(sid) == "gpu-a")
    a = lb.backends["gpu-a"]
    a.fault("stall", seconds=30)          # frozen engine: the next request stays in flight until "none"
    result: dict[str, requests.Response] = {}

    def in_flight() -> None:
        result["resp"] = lb.complete(sticky, timeout=30)

    worker = threading.Thread(target=in_flight, daemon=True)
    worker.start()
    try:
        wait_until(lambda: a.in_flight() == 1, what="request in flight on gpu-a")
        lb.set_status("gpu-a", AgentStatus(S.DRAINING, 0.1, "restart"))
        st = lb.wait_for("gpu-a", lambda st: st.draining, "DRAIN")
        assert st.current_sessions == 1
        served = Counter(lb.served_by(sid) for sid in [sticky, *sessions(40)])
        assert served == Counter({"gpu-b": 41}), served
        assert worker.is_alive()                      # still in flight on the drained server
    finally:
        a.fault("none")
        worker.join(timeout=30)
    resp = result["resp"]
    assert resp.status_code == 200 and resp.json()["model"] == "gpu-a"
    lb.wait_for("gpu-a", lambda st: st.current_sessions == 0, "no sessions after the in-flight one ended")


def test_bounded_load_moves_sessions_off_a_full_server(lb: LB) -> None:
    """hash-balance-factor 150: with k requests in flight on gpu-a and none elsewhere, gpu-a may hold at
    most ceil(1.5 (k+1)) / 2 of them, so from the 4th concurrent gpu-a session on, requests overflow to
    gpu-b although gpu-a is their first choice (stickiness broken under load, on purpose)."""
    lb.all_ready()
    sticky_a = []
    for sid in sessions(200):
        lb.at_rest()
        if lb.served_by(sid) == "gpu-a":
            sticky_a.append(sid)
        if len(sticky_a) == 5:
            break
    assert len(sticky_a) == 5
    a = lb.backends["gpu-a"]
    a.fault("stall", seconds=30)
    results: dict[str, requests.Response] = {}
    workers: list[threading.Thread] = []
    try:
        for sid in sticky_a:
            worker = threading.Thread(target=lambda sid=sid: results.__setitem__(sid, lb.complete(sid, 30)),
                                      daemon=True)
            before = a.in_flight()
            worker.start()
            workers.append(worker)
            # the request either stays in flight on the stalled gpu-a, or gpu-b answers it
            wait_until(lambda sid=sid, before=before: sid in results or a.in_flight() > before,
                       what=f"{sid} placed")
        stuck_on_a = a.in_flight()
        overflow = [sid for sid in sticky_a if sid in results]
        assert stuck_on_a <= 3 and len(overflow) == 5 - stuck_on_a, (stuck_on_a, overflow)
        assert all(results[sid].json()["model"] == "gpu-b" for sid in overflow)
    finally:
        a.fault("none")
        for worker in workers:
            worker.join(timeout=30)
    assert all(results[sid].status_code == 200 for sid in sticky_a)


def test_down_backend_gets_nothing_until_up_again(lb: LB) -> None:
    lb.all_ready()
    lb.set_status("gpu-a", AgentStatus(S.ERROR, None, "warm-up timeout"))
    lb.wait_for("gpu-a", lambda st: st.down, "DOWN")
    ids = sessions(40)
    down = Counter(lb.served_by(sid) for sid in ids)
    assert down == Counter({"gpu-b": 40}), down

    lb.set_status("gpu-a", AgentStatus(S.READY, 0.1))
    lb.wait_for("gpu-a", lambda st: st.status == "UP", "UP again")
    back = Counter(lb.served_by(sid) for sid in ids)
    assert back["gpu-a"] > 0, f"gpu-a should take its sessions back: {back}"


def test_unknown_agent_name_marks_server_down(lb: LB) -> None:
    """agent-send reaches us verbatim: a name we do not know gets `down #unknown backend`."""
    lb.all_ready()
    del lb.table["gpu-b"]
    try:
        lb.wait_for("gpu-b", lambda st: st.down, "DOWN (unknown to the agent)")
        assert lb.stats()["gpu-a"].up
    finally:
        lb.all_ready()
