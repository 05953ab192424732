"""GET /api/backends/<name>/readiness (remediator/web/api.py): what each vLLM pod's readiness sidecar polls.

Ready exactly when the HAProxy agent would answer `ready up W%` (agent_check.takes_traffic, one rule):
READY and in service, a verified unhealthy incident takes it out unless the min_ready floor keeps it,
a dry run keeps everything in; an operator's drain or retirement takes it out. No token, 404 for a
name that is not a backend, and cheap: one backend's rows, no KV reading.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import agent_reply
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, fleet, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

def readiness(w: World, name: str = "gpu-a") -> dict[str, Any]:
    r = w.client.get(f"/api/backends/{name}/readiness")
    assert r.status_code == 200, r.get_data(as_text=True)
    body = r.get_json()
    assert set(body) == {"backend", "ready", "lifecycle", "admin", "reason"} and body["backend"] == name
    return body


def agent_says(w: World, name: str) -> str:
    return agent_reply(AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2).status_for(name))


def agrees_with_the_agent(w: World, *names: str) -> None:
    for name in names:
        assert readiness(w, name)["ready"] == agent_says(w, name).startswith("ready up"), name


def command(w: World, name: str, what: str) -> None:
    r = w.client.post(f"/api/backends/{name}/{what}", json={"by": "ops@host1", "reason": "kernel upgrade"},
                      headers=AUTH)
    assert r.status_code == 200, r.get_data(as_text=True)


def test_ready_and_in_service_is_ready_without_a_token(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    try:
        assert readiness(w) == {"backend": "gpu-a", "ready": True, "lifecycle": "ready", "admin": "in_service",
                                "reason": "ready and in service"}
        r = w.client.get("/api/backends/nope/readiness")
        assert r.status_code == 404 and "unknown backend" in r.get_json()["error"]
    finally:
        w.close()


def test_a_backend_not_looked_at_yet_is_not_ready(tmp_path: Path) -> None:
    w = four_backends(tmp_path)
    try:
        body = readiness(w, "gpu-a")
        assert body["ready"] is False and body["lifecycle"] == "initializing"
    finally:
        w.close()


def test_an_operators_drain_and_retirement_take_it_out_until_undone(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1)
    try:
        command(w, "gpu-a", "drain")
        body = readiness(w)
        assert body["ready"] is False and body["lifecycle"] == "ready" and body["admin"] == "drained"
        assert body["reason"] == "drained by ops@host1: kernel upgrade"
        w.run()
        assert readiness(w)["ready"] is False                    # an authority pass changes nothing
        command(w, "gpu-a", "undrain")
        assert readiness(w)["ready"] is True
        command(w, "gpu-a", "retire")
        assert readiness(w)["admin"] == "retired" and readiness(w)["ready"] is False
        command(w, "gpu-a", "activate")
        assert readiness(w)["ready"] is True
    finally:
        w.close()


def test_a_restart_is_out_from_the_drain_until_the_warm_up_gate_passes(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"))
    try:
        w.deliver(payload(alert("gpu-a")))
        assert readiness(w)["ready"] is True                     # an alert alone takes nothing out
        w.run()
        assert readiness(w)["lifecycle"] == "draining" and readiness(w)["ready"] is False
        agrees_with_the_agent(w, "gpu-a", "gpu-b")
        w.ready["gpu-a"] = False                                 # the restarted server is still loading
        w.run_until(lambda: w.state() == "initializing", "restart action ran")
        body = readiness(w)
        assert body["ready"] is False and "initializing" in body["reason"]
        agrees_with_the_agent(w, "gpu-a", "gpu-b")
        w.ready["gpu-a"] = True
        w.run_until(lambda: w.state() == "ready", "warm-up gate passed")
        assert readiness(w)["ready"] is True and w.restarted == ["gpu-a"]
    finally:
        w.close()


def test_a_verified_unresponsive_backend_is_out_but_never_below_min_ready(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1, unresponsive_after=1000)
    try:
        w.outcomes.update(dict.fromkeys(w.outcomes, "unresponsive"))
        w.deliver(payload(alert("gpu-a")))
        w.run()
        body = readiness(w, "gpu-a")
        assert body["ready"] is False and body["lifecycle"] == "ready" and "verified unresponsive" in body["reason"]
        assert readiness(w, "gpu-b")["ready"] is True
        w.deliver(payload(alert("gpu-b")))
        w.run()
        for name in ("gpu-a", "gpu-b"):                          # both out would leave none: both kept in
            body = readiness(w, name)
            assert body["ready"] is True and "kept up" in body["reason"] and "min_ready 1" in body["reason"]
        agrees_with_the_agent(w, "gpu-a", "gpu-b")
    finally:
        w.close()


def test_a_dry_run_changes_no_readiness(tmp_path: Path) -> None:
    w = fleet(tmp_path, dry_run=True)
    try:
        w.outcomes["gpu-a"] = "down"
        w.deliver(payload(alert()))
        w.run()
        body = readiness(w)
        assert body["ready"] is True and body["reason"].startswith("dry run: kept up")
    finally:
        w.close()


class CountingStore:
    """A store whose reader() records which read verbs were called."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[str] = []

    @contextmanager
    def reader(self) -> Iterator[Any]:
        outer = self

        class Spy:
            def __init__(self, rd: Any) -> None:
                self.rd = rd

            def __getattr__(self, name: str) -> Any:
                outer.calls.append(name)
                return getattr(self.rd, name)

        with self.store.reader() as rd:
            yield Spy(rd)


def test_readiness_reads_one_backend_and_no_kv(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b"), min_ready=1, unresponsive_after=1000)
    try:
        kv_reads: list[str] = []
        store = CountingStore(w.store)
        answers = AgentAnswers(store, w.config, kv_reader=lambda url: kv_reads.append(url) or 0.2)  # type: ignore[arg-type]
        assert answers.status_for("gpu-a", weigh=False) is not None
        assert set(store.calls) == {"lifecycle", "active_incident", "admin"} and kv_reads == []
        assert answers.status_for("gpu-a") is not None and len(kv_reads) == 1   # HAProxy's answer weighs
        # the floor counts the others only for a READY backend with a reason to go out
        w.outcomes["gpu-a"] = "unresponsive"
        w.deliver(payload(alert("gpu-a")))
        w.run()
        store.calls.clear()
        assert answers.status_for("gpu-a", weigh=False) is not None
        assert {"lifecycles", "active_incidents", "admins"} <= set(store.calls)
    finally:
        w.close()
