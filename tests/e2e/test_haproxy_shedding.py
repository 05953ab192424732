"""Explicit shedding and least-loaded placement in a real HAProxy 2.6, under load.

The backend section and the per-server limits come from the shipped deploy/haproxy/haproxy.cfg
(tests/support/haproxy.render_config); the limits are those of the sizing rule for engines with 2 slots
(maxconn 4, maxqueue 2), and `timeout queue` is shortened so a queue timeout is seen within seconds. The
two servers are in-process SlotServers (tests/support/slots.py): 2 slots each, the rest waiting in their
own queue like an engine, and a completion whose body says `"hold": tag` keeps its slot until the test
releases the tag. Our agent-check server answers HAProxy's agent checks from a table the tests set.
Waiting is polling (`show stat`, the servers' counters) with deadlines.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests

from llm_health.drill.procs import ManagedProcess, free_port, wait_until
from llm_health.remediator.agent_check import AgentCheckServer, AgentStatus
from llm_health.remediator.drain import ServerStat, show_stat, stats_command
from llm_health.remediator.lifecycle import LifecycleState
from tests.support.haproxy import Sizing, render_config
from tests.support.slots import SlotServer

S = LifecycleState
NAMES = ("gpu-a", "gpu-b")
HAPROXY = shutil.which("haproxy")
SIZE = Sizing(2)                 # maxconn 4, maxqueue 2
TIMEOUT_QUEUE = 6.0              # `timeout queue` for this test (shipped: 15s, tests/deploy/test_haproxy_sizing.py)
AT_ONCE = 3.0                    # a 503 "at once" comes well before the queue timeout, even on a loaded machine

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(HAPROXY is None, reason="haproxy not installed")]


@dataclass
class Sent:
    """One request through the proxy, sent from its own thread."""

    thread: threading.Thread
    started: float = field(default_factory=time.monotonic)
    response: requests.Response | None = None
    error: BaseException | None = None
    elapsed: float = 0.0

    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self, timeout: float = 30) -> requests.Response:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "no answer in time"
        assert self.response is not None, f"request failed: {self.error!r}"
        return self.response


@dataclass
class Rig:
    url: str
    socket_path: str
    table: dict[str, AgentStatus]
    servers: dict[str, SlotServer]
    sent: list[Sent] = field(default_factory=list)

    # -- HAProxy's view -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, ServerStat]:
        return {srv: st for (px, srv), st in show_stat(self.socket_path).items() if px == "vllm"}

    def queued(self) -> dict[str, int]:
        """qcur per server and for the backend's own queue ("BACKEND": requests not yet given a server)."""
        rows = csv.DictReader(io.StringIO(stats_command(self.socket_path, "show stat").lstrip()[2:]))
        return {row["svname"]: int(row["qcur"] or 0) for row in rows if row["pxname"] == "vllm"}

    def total_queued(self) -> int:
        return sum(self.queued().values())

    def in_haproxy(self) -> int:
        return sum(st.current_sessions for st in self.stats().values())

    # -- steering ------------------------------------------------------------------------------------------

    def set_status(self, name: str, status: AgentStatus, predicate, what: str) -> None:  # noqa: ANN001
        self.table[name] = status
        wait_until(lambda: predicate(self.stats()[name]), timeout=15, interval=0.05,
                   what=f"{name} {what} (now {self.stats().get(name)})")

    def ready(self, name: str) -> None:
        self.set_status(name, AgentStatus(S.READY, 0.1), lambda st: st.status == "UP" and st.weight == 100,
                        "UP with weight 100")

    # -- requests ------------------------------------------------------------------------------------------

    def send(self, session: str | None = None, hold: str | None = None, timeout: float = 60) -> Sent:
        headers = {"X-Session-Id": session} if session is not None else {}
        body: dict[str, object] = {"prompt": "hi", "max_tokens": 1}
        if hold is not None:
            body["hold"] = hold

        def run() -> None:
            try:
                sent.response = requests.post(self.url + "/v1/completions", json=body, headers=headers,
                                              timeout=timeout)
            except BaseException as exc:  # noqa: BLE001 - reported by result()
                sent.error = exc
            finally:
                sent.elapsed = time.monotonic() - sent.started

        sent = Sent(threading.Thread(target=run, daemon=True))
        self.sent.append(sent)
        sent.thread.start()
        return sent

    def served_by(self, session: str | None) -> str:
        resp = self.send(session).result(10)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["model"])

    def at_rest(self, held: dict[str, int] | None = None) -> None:
        """HAProxy counts only the held requests (`held` per server, default none) and queues nothing."""
        held = held or {}
        wait_until(lambda: all(st.current_sessions == held.get(name, 0) for name, st in self.stats().items())
                   and self.total_queued() == 0, timeout=10, interval=0.01, what=f"HAProxy at rest with {held}")

    def sessions_on(self, name: str, count: int) -> list[str]:
        """Sessions whose first choice (at rest) is `name`."""
        found: list[str] = []
        for _ in range(200):
            sid = f"s-{uuid.uuid4().hex[:12]}"
            self.at_rest()
            if self.served_by(sid) == name:
                found.append(sid)
                if len(found) == count:
                    return found
        raise AssertionError(f"no {count} sessions on {name} among 200")

    def hold_on(self, name: str, count: int, tag: str) -> list[Sent]:
        """`count` requests kept in flight on `name`: the other servers drained meanwhile, so least_loaded
        has only `name` to choose (which also shows that it skips drained servers)."""
        others = [n for n in self.servers if n != name]
        for other in others:
            self.set_status(other, AgentStatus(S.DRAINING, 0.1, "test"), lambda st: st.draining, "DRAIN")
        before = {n: s.in_flight for n, s in self.servers.items()}
        sent = []
        for i in range(count):
            sent.append(self.send(hold=tag))
            wait_until(lambda i=i: self.servers[name].held(tag) == i + 1 or sent[-1].done(),
                       what=f"request {i + 1} held on {name}")
        assert self.servers[name].held(tag) == count, [s.response for s in sent if s.done()]
        assert all(self.servers[n].in_flight == before[n] for n in others), "a drained server got a request"
        for other in others:
            self.ready(other)
        return sent


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("haproxy-shedding")
    table = {name: AgentStatus(S.READY, 0.1) for name in NAMES}
    agent = AgentCheckServer("127.0.0.1", 0, table.get).start()
    servers = {name: SlotServer(name, SIZE.slots).start() for name in NAMES}
    proc: ManagedProcess | None = None
    try:
        fe_port = free_port()
        socket_path = str(tmp / "admin.sock")
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(render_config(fe_port, socket_path, agent.port, servers,  # type: ignore[arg-type]
                                     slots=SIZE.slots, timeout_queue=f"{TIMEOUT_QUEUE:g}s"))
        proc = ManagedProcess([HAPROXY, "-db", "-f", str(cfg)], name="haproxy", log_dir=tmp)
        rig = Rig(f"http://127.0.0.1:{fe_port}", socket_path, table, servers)

        def up() -> bool:
            if not proc.alive():
                raise RuntimeError(f"haproxy exited:\n{proc.log()}")
            stats = rig.stats()
            return len(stats) == len(NAMES) and all(st.status == "UP" for st in stats.values())

        wait_until(up, timeout=15, what="haproxy servers UP")
        yield rig
    finally:
        if proc is not None:
            proc.stop()
        agent.stop()
        for server in servers.values():
            server.stop()


@pytest.fixture(autouse=True)
def clean(rig: Rig) -> Iterator[None]:
    for name in NAMES:
        rig.ready(name)
    yield
    for server in rig.servers.values():
        server.release()
    for sent in rig.sent:
        sent.thread.join(TIMEOUT_QUEUE + 30)
    rig.sent.clear()
    for name in NAMES:
        rig.ready(name)
    rig.at_rest()
    wait_until(lambda: all(s.in_flight == 0 for s in rig.servers.values()), what="servers idle")
    for server in rig.servers.values():
        server.reset()


def assert_shed(resp: requests.Response) -> None:
    """HAProxy's 503 as the shipped config words it: Retry-After and a JSON error an OpenAI client reads."""
    assert resp.status_code == 503, (resp.status_code, resp.text)
    assert resp.headers.get("Retry-After", "").isdigit() and int(resp.headers["Retry-After"]) > 0, resp.headers
    assert resp.headers.get("Content-Type") == "application/json", resp.headers
    error = json.loads(resp.text)["error"]
    assert error["message"] and error["type"] == "server_error", error


def queue_until_refused(rig: Rig, limit: int, queued_now, **send: str) -> tuple[list[Sent], Sent]:  # noqa: ANN001
    """Send one request at a time until one is answered; each before it must be waiting in HAProxy's queue
    (`queued_now()` grew) - never in an engine beyond its maxconn."""
    waiting: list[Sent] = []
    for _ in range(limit + 1):
        sent = rig.send(**send)
        wait_until(lambda sent=sent: sent.done() or queued_now() > len(waiting)
                   or any(s.in_flight > SIZE.maxconn for s in rig.servers.values()),
                   what=f"request {len(waiting) + 1} queued or answered")
        assert all(s.in_flight <= SIZE.maxconn for s in rig.servers.values()), (
            f"an engine got more than maxconn={SIZE.maxconn}: {[s.in_flight for s in rig.servers.values()]}")
        if sent.done():
            return waiting, sent
        waiting.append(sent)
    raise AssertionError(f"{len(waiting)} requests queued and none refused (queue bound {limit})")


def test_full_fleet_answers_503_with_retry_after_at_once_instead_of_queueing(rig: Rig) -> None:
    # every server full: maxconn requests in flight on each (2 running in the engine, 2 in its own queue)
    fill = [sent for name in NAMES for sent in rig.hold_on(name, SIZE.maxconn, "fill")]
    assert {n: st.current_sessions for n, st in rig.stats().items()} == {n: SIZE.maxconn for n in NAMES}
    assert [(s.running, s.waiting) for s in rig.servers.values()] == [(SIZE.slots, SIZE.maxconn - SIZE.slots)] * 2

    # no session: the backend's queue takes about maxqueue per usable server, then 503 at once
    bound = len(NAMES) * SIZE.maxqueue + 1
    waiting, refused = queue_until_refused(rig, bound, lambda: rig.queued()["BACKEND"], hold="late")
    assert 0 < len(waiting) <= bound
    assert refused.elapsed < AT_ONCE, refused.elapsed
    assert_shed(refused.result())

    # a session: waits in its own server's queue, at most maxqueue, then 503 at once
    sid = f"s-{uuid.uuid4().hex[:12]}"
    per_server = lambda: sum(q for name, q in rig.queued().items() if name in NAMES)  # noqa: E731
    sticky, refused = queue_until_refused(rig, SIZE.maxqueue, per_server, session=sid, hold="late")
    assert len(sticky) == SIZE.maxqueue
    assert refused.elapsed < AT_ONCE, refused.elapsed
    assert_shed(refused.result())

    # a request that generates nothing (the exporter's proxy check) needs no slot: answered at once
    started = time.monotonic()
    models = requests.get(rig.url + "/v1/models", timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["id"] in NAMES, models.text
    assert time.monotonic() - started < AT_ONCE

    # nothing waits without end: after `timeout queue` every waiting request has its 503 too
    for sent in waiting + sticky:
        resp = sent.result(TIMEOUT_QUEUE + 30)
        assert_shed(resp)
        assert TIMEOUT_QUEUE - 0.5 <= sent.elapsed < TIMEOUT_QUEUE + 20, sent.elapsed

    # the admitted ones were never touched
    for server in rig.servers.values():
        server.release("fill")
    assert all(sent.result().status_code == 200 for sent in fill)
    assert [s.max_in_flight for s in rig.servers.values()] == [SIZE.maxconn] * 2


@pytest.mark.parametrize("busy", NAMES)
def test_request_without_session_goes_to_the_least_loaded_server(rig: Rig, busy: str) -> None:
    (idle,) = [n for n in NAMES if n != busy]
    rig.hold_on(busy, 3, "busy")
    rig.at_rest({busy: 3})
    got = Counter()
    for _ in range(10):
        got[rig.served_by(None)] += 1
        rig.at_rest({busy: 3})
    assert got == Counter({idle: 10}), f"{busy} holds 3 requests, {idle} none: {dict(got)}"


def test_a_server_with_a_full_kv_cache_gets_new_requests_only_when_the_other_is_full(rig: Rig) -> None:
    """Load is counted per unit of weight, like leastconn: a server at weight 16 (kv 0.99) with no request
    is busier than one at weight 100 with 2 of its 4 slots taken - until that one is full."""
    rig.hold_on("gpu-a", 2, "busy")
    rig.set_status("gpu-b", AgentStatus(S.READY, 0.99), lambda st: st.up and st.weight == 16, "weight 16")
    assert Counter(rig.served_by(None) for _ in range(5)) == Counter({"gpu-a": 5})
    rig.send(hold="busy")
    rig.send(hold="busy")
    wait_until(lambda: rig.servers["gpu-a"].held("busy") + rig.servers["gpu-b"].held("busy") == 4,
               what="two more held")
    assert rig.stats()["gpu-a"].current_sessions == SIZE.maxconn
    assert Counter(rig.served_by(None) for _ in range(5)) == Counter({"gpu-b": 5})


def test_request_with_session_sticks_while_another_server_is_less_loaded(rig: Rig) -> None:
    """Affinity wins while the session's server is under the bounded-load limit: 2 in flight there, 1 on the
    other server (within hash-balance-factor 150), the session stays, a request without one does not."""
    home, other = NAMES
    (sid,) = rig.sessions_on(home, 1)
    rig.hold_on(home, 2, "busy")
    rig.hold_on(other, 1, "busy")
    held = {home: 2, other: 1}
    for _ in range(5):
        rig.at_rest(held)
        assert rig.served_by(sid) == home
    rig.at_rest(held)
    assert rig.served_by(None) == other


def test_drained_or_down_server_gets_no_request_without_session(rig: Rig) -> None:
    """least_loaded skips servers that take no new requests, even idle ones; with none up, the 503 reply."""
    rig.hold_on("gpu-a", 2, "busy")             # gpu-a is the busier one ...
    rig.set_status("gpu-b", AgentStatus(S.DRAINING, 0.1, "restart"), lambda st: st.draining, "DRAIN")
    assert Counter(rig.served_by(None) for _ in range(5)) == Counter({"gpu-a": 5})    # ... but gpu-b drains
    rig.set_status("gpu-b", AgentStatus(S.ERROR, None, "warm-up timeout"), lambda st: st.down, "DOWN")
    assert Counter(rig.served_by(None) for _ in range(5)) == Counter({"gpu-a": 5})
    # no server up at all: the same 503, with or without a session
    rig.set_status("gpu-a", AgentStatus(S.ERROR, None, "warm-up timeout"), lambda st: st.down, "DOWN")
    for session in (None, "s-any"):
        sent = rig.send(session)
        assert_shed(sent.result(10))
        assert sent.elapsed < AT_ONCE
