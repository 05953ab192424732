"""Reviewer findings on the remediator, in-process: the agent never takes servers out on an unverified
alert (nor in dry run, nor below min_ready), restarts that raise never leave a stuck state, `unresponsive`
only after `unresponsive_after`, re-verification at the end of a drain, rationed ERROR checks, probe
counting and the API key. Same World as test_remediator_lifecycle (fake clock, injected verifier and
runner, real SQLite / webhook / API / metrics); probes go to a real in-process simulator.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from llm_health.exporter.observation import Verification
from llm_health.remediator import action, backend_io, policy
from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.agent_check import agent_reply
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.restart import act as restart_act
from llm_health.remediator.store import SqliteStore
from llm_health.simulator.server import SimConfig, Simulator

from llm_health.config import RemediatorSettings, parse_config
from llm_health.drill.procs import free_port, wait_until
from tests.support.alerts import alert, one_pass, payload
from tests.support.fakes import has_sample
from tests.support.remediator import AUTH, World, fleet


def answer(w: World, name: str) -> str:
    return agent_reply(AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2).status_for(name))


# -- 1. the HAProxy agent ------------------------------------------------------------------------------
def test_alerts_for_every_backend_without_verification_take_no_server_out(tmp_path: Path) -> None:
    """Prometheus loses sight of every vLLM: LLMBackendDown fires for all; verification cannot tell."""
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"))
    w.outcomes.update(dict.fromkeys(w.outcomes, "unknown"))
    w.deliver(payload(*(alert(n, alertname="LLMBackendDown") for n in ("gpu-a", "gpu-b", "gpu-c"))))
    assert {answer(w, n) for n in ("gpu-a", "gpu-b", "gpu-c")} == {"ready up 100%"}   # before any look
    w.run()
    assert {w.last_incident(n)["verified_outcome"] for n in ("gpu-a", "gpu-b", "gpu-c")} == {"unknown"}
    assert {answer(w, n) for n in ("gpu-a", "gpu-b", "gpu-c")} == {"ready up 100%"}
    assert w.restarted == []


def test_verified_unresponsive_takes_a_server_out_but_never_below_min_ready(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), min_ready=1, unresponsive_after=1000)
    w.outcomes.update(dict.fromkeys(w.outcomes, "unresponsive"))
    w.deliver(payload(alert("gpu-a"), alert("gpu-b")))
    w.run()
    assert answer(w, "gpu-a") == "down #verified unresponsive incident 1"
    assert answer(w, "gpu-b") == "down #verified unresponsive incident 2"
    assert answer(w, "gpu-c") == "ready up 100%"
    w.deliver(payload(alert("gpu-c")))
    w.run()
    # every backend verified unresponsive: taking any out would leave none READY and up
    agent = AgentAnswers(w.store, w.config, kv_reader=lambda url: 0.2)
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        status = agent.status_for(n)
        assert status is not None and agent_reply(status) == "ready up 100%"
        assert "verified unresponsive" in status.reason and "min_ready 1" in status.reason
    assert w.restarted == [] and {w.state(n) for n in ("gpu-a", "gpu-b", "gpu-c")} == {"ready"}


def test_dry_run_never_changes_the_load_balancer(tmp_path: Path) -> None:
    w = fleet(tmp_path, dry_run=True)
    w.outcomes["gpu-a"] = "down"
    w.deliver(payload(alert()))
    w.run()
    assert w.last_incident()["state"] == "observed" and w.last_incident()["verified_outcome"] == "down"
    assert answer(w, "gpu-a") == "ready up 100%" and w.restarted == []


# -- 2. exceptions between the claim and the recorded result ---------------------------------------------
def raising_runner(exc: Exception) -> Any:
    def run(argv: Sequence[str], timeout: float, env: dict[str, str]) -> action.ActionResult:
        raise exc
    return run


def test_runner_that_raises_leaves_needs_ack_error_and_frees_the_host(tmp_path: Path) -> None:
    w = fleet(tmp_path, hosts={"gpu-a": "n1", "gpu-b": "n1"})
    w.authority.io.runner = raising_runner(ValueError("embedded null byte"))
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False                      # still not answering: needs_ack stays
    w.deliver(payload(alert("gpu-a")))
    w.run()
    inc = w.last_incident()
    assert inc["state"] == "needs_ack" and inc["last_decision"] == "aborted"
    assert w.state("gpu-a") == "error"
    rows = w.store.conn().execute("SELECT result, output FROM actions").fetchall()
    assert [r["result"] for r in rows] == ["error"] and "embedded null byte" in rows[0]["output"]
    aborted = w.store.events(kind="aborted")
    assert len(aborted) == 1 and "ValueError" in aborted[0].reason
    assert "escalated" in w.kinds("gpu-a")
    # the host mutex is free again: gpu-b on the same host can be restarted
    w.authority.io.runner = lambda argv, timeout, env: (w.restarted.append(env["LLM_HEALTH_BACKEND"])
                                                      or action.ActionResult(action.OK, 0, "ok"))
    w.outcomes["gpu-b"] = "down"
    w.deliver(payload(alert("gpu-b")))
    w.run()
    assert w.restarted == ["gpu-b"] and "restarted" in w.kinds("gpu-b")
    assert w.last_incident()["state"] == "needs_ack"                   # gpu-a: never repeated blindly


def test_silence_that_raises_is_handled_like_a_failed_restart(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    w = fleet(tmp_path)
    def locked(ctx: Any, incident_id: int, backend: Any) -> None:
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(restart_act, "silence", locked)
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.run()
    assert w.last_incident()["state"] == "needs_ack" and w.state() == "error"
    assert w.store.conn().execute("SELECT count(*) FROM actions WHERE result IS NULL").fetchone()[0] == 0


def test_own_restart_whose_bookkeeping_failed_is_swept_by_recover(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    w = fleet(tmp_path)
    w.authority.io.runner = raising_runner(OSError("fork failed"))
    aborts: list[int] = []

    def abort_that_cannot_write(ctx: Any, incident_id: int, action_id: int, backend: Any, exc: BaseException) -> None:
        aborts.append(action_id)                  # as if SQLite stayed locked: nothing recorded
        ctx.on_abort_unrecorded()
    monkeypatch.setattr(restart_act, "abort", abort_that_cannot_write)
    w.outcomes["gpu-a"] = "down"
    w.ready["gpu-a"] = False
    w.deliver(payload(alert()))
    w.authority.lease.renew()
    one_pass(w.authority)
    assert aborts and w.last_incident()["state"] == "restarting"
    one_pass(w.authority)                            # recover() runs again and finds our own open row
    assert w.last_incident()["state"] == "needs_ack" and w.state() == "error"
    assert w.store.conn().execute("SELECT result FROM actions").fetchone()[0] == "interrupted"
    assert w.store.events(kind="interrupted")[0].detail["own"] is True


# -- 3. unresponsive -------------------------------------------------------------------------------------
def test_policy_unresponsive_is_unknown_until_it_persisted() -> None:
    s = policy.Settings(unknown_retry=5, unresponsive_after=120)
    v = Verification("unresponsive", "every reading timed out")
    first = policy.decide(policy.Facts(now=1000.0, backend="a", unresponsive_since=None), v, s)
    assert first.kind == policy.DEFERRED_UNKNOWN and first.retry_at == 1005.0
    held = policy.decide(policy.Facts(now=1119.0, backend="a", unresponsive_since=1000.0), v, s)
    assert held.kind == policy.DEFERRED_UNKNOWN and held.retry_at == 1120.0
    due = policy.decide(policy.Facts(now=1120.0, backend="a", unresponsive_since=1000.0), v, s)
    assert due.kind == policy.RESTART
    assert due.reason.startswith("verified unresponsive: no answer to /metrics for 120 s with work in flight")
    dry = policy.decide(policy.Facts(now=1200.0, backend="a", unresponsive_since=1000.0, dry_run=True), v, s)
    assert dry.kind == policy.WOULD_RESTART
    assert policy.decide(policy.Facts(now=1000.0, backend="a"), Verification("unknown", ""), s).kind == \
        policy.DEFERRED_UNKNOWN
    with pytest.raises(ValueError):     # an outcome outside VerifyOutcome never reaches the policy
        Verification("weird", "")


def test_unresponsive_restarts_once_after_the_window_and_a_break_restarts_the_window(tmp_path: Path) -> None:
    w = fleet(tmp_path, unresponsive_after=120)
    w.outcomes["gpu-a"] = "unresponsive"
    w.deliver(payload(alert()))
    w.run()
    first = w.last_incident()["unresponsive_since"]
    assert first == w.clock.t and w.state() == "ready"
    w.clock.advance(60)
    w.run()
    w.outcomes["gpu-a"] = "unknown"                # one answer in between: the run is broken
    w.clock.advance(1)
    w.run()
    assert w.last_incident()["unresponsive_since"] is None
    w.outcomes["gpu-a"] = "unresponsive"
    w.clock.advance(1)
    w.run()
    assert w.last_incident()["unresponsive_since"] == w.clock.t
    for _ in range(11):                            # consecutive samples (a gap of two verifications starts over)
        w.clock.advance(10)
        w.run()
    w.clock.advance(9)
    w.run()
    assert w.restarted == [] and w.state() == "ready"
    w.clock.advance(1)
    w.run()
    assert w.state() == "draining"
    w.clock.advance(5)                             # treated like a stall: stalled_drain_timeout
    w.run()
    w.clock.advance(5)
    w.run(5)
    assert w.restarted == ["gpu-a"]
    assert len(w.store.events(kind="restarting", backend="gpu-a")) == 1
    draining = w.store.events(kind="draining", backend="gpu-a")
    assert len(draining) == 1 and "no answer to /metrics for 120 s with work in flight" in draining[0].reason


# -- 4. the re-verification window -----------------------------------------------------------------------
def test_default_window_outlasts_a_long_engine_step() -> None:
    r = RemediatorSettings()
    assert (r.verify_readings, r.verify_interval) == (3, 10.0)
    assert (r.verify_readings - 1) * r.verify_interval == 20.0
    assert r.unresponsive_after == 120.0


# -- 5. re-verification at the end of the drain ------------------------------------------------------------
def test_resolved_during_the_drain_and_verified_healthy_calls_the_restart_off(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining"
    w.deliver(payload(alert(status="resolved")))
    w.outcomes["gpu-a"] = "idle_ok"                # counters frozen, work stays: only a verification tells
    w.clock.advance(5)
    w.run()
    assert w.restarted == [] and w.state() == "ready"
    inc = w.last_incident()
    assert inc["state"] == "closed" and inc["close_reason"] == "verified_healthy"
    assert w.steps()[-1] == ("draining", "ready")


def test_resolved_during_the_drain_but_still_stalled_restarts(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    w.deliver(payload(alert()))
    w.run()
    w.deliver(payload(alert(status="resolved")))
    w.clock.advance(5)
    w.run()
    assert w.restarted == ["gpu-a"]
    assert "re-verified at the end of the drain" in w.store.events(kind="restarting")[0].reason


def test_drain_without_a_starting_reading_reverifies_before_the_restart(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    verified: list[str] = []
    outcomes = w.outcomes

    def verifier(b: Any) -> Verification:
        verified.append(b.name)
        return Verification(outcomes[b.name], "fake verifier")
    w.authority.io.verifier = verifier
    w.authority.io.in_flight = lambda b: InFlight(None, None, None, "reading failed")
    w.deliver(payload(alert()))
    w.run()
    assert w.state() == "draining" and verified == ["gpu-a"]
    outcomes["gpu-a"] = "progress"
    w.clock.advance(5)
    w.run()
    assert verified == ["gpu-a", "gpu-a"] and w.restarted == [] and w.state() == "ready"
    assert w.last_incident()["close_reason"] == "verified_healthy"


# -- 6. ERROR backends: after the incidents, rationed; probes counted ------------------------------------------
def to_error(w: World, name: str) -> None:
    w.ready[name] = False
    w.deliver(payload(alert(name)))
    w.run()
    w.clock.advance(5)
    w.run()
    w.clock.advance(101)
    w.run()
    assert w.state(name) == "error"
    assert w.client.post(f"/api/backends/{name}/ack", headers=AUTH).status_code == 200


def test_error_backends_are_checked_after_incidents_and_at_most_every_30s(tmp_path: Path) -> None:
    w = fleet(tmp_path)
    to_error(w, "gpu-a")
    order: list[str] = []
    warm, verify = w.authority.io.warmup_check, w.authority.io.verifier
    w.authority.io.warmup_check = lambda b: (order.append(f"warmup {b.name}"), warm(b))[1]
    w.authority.io.verifier = lambda b: (order.append(f"verify {b.name}"), verify(b))[1]
    w.clock.advance(60)
    w.deliver(payload(alert("gpu-b")))
    w.run(1)
    assert order == ["verify gpu-b", "warmup gpu-a"]
    for _ in range(29):
        w.clock.advance(1)
        w.run(1)
    assert order.count("warmup gpu-a") == 1
    w.clock.advance(1)
    w.run(1)
    assert order.count("warmup gpu-a") == 2


@pytest.fixture
def sim() -> Any:
    s = Simulator(SimConfig(port=free_port(), model="sim-model")).start()
    try:
        wait_until(lambda: requests.get(s.url + "/health", timeout=1).ok, what="simulator")
        yield s
    finally:
        s.stop()


def test_every_probe_is_counted_in_sqlite_and_metrics(tmp_path: Path, sim: Simulator) -> None:
    (tmp_path / "key").write_text("secret-key\n")
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": sim.url, "model": "sim-model", "restart": ["true"]}],
        "exporter": {"read_timeout": 2.0, "probe_timeout": 5.0, "api_key_file": "key"},
        "remediator": {"state": "state.db", "verify_readings": 2, "verify_interval": 0.1, "insecure_no_auth": True},
    }, source=str(tmp_path / "llm-health.yml"))
    app = create_app(config, with_authority=False)
    store = app.extensions["remediator"].store
    auth = Authority(store, config, holder="probe-test")
    backend = config.backend("gpu-a")
    assert backend is not None
    v = auth.io.verifier(backend)
    assert v.outcome == "idle_ok"
    ready, why = auth.io.warmup_check(backend)
    assert ready, why
    assert store.counters("probes") == {"gpu-a\tverify": 1, "gpu-a\twarmup": 1}
    text = app.test_client().get("/metrics").get_data(as_text=True)
    assert has_sample(text, 'llm_health_remediator_probes_total{backend="gpu-a",purpose="verify"} 1')
    assert has_sample(text, 'llm_health_remediator_probes_total{backend="gpu-a",purpose="warmup"} 1')
    from llm_health.exporter import check
    assert check.verify(sim.url, readings=2, interval=0.1).outcome == "idle_ok"   # outside: not counted
    assert store.counters("probes") == {"gpu-a\tverify": 1, "gpu-a\twarmup": 1}
    store.close()


# -- 7. the exporter's API key reaches verify ----------------------------------------------------------------
def test_api_key_file_is_read_once_and_passed_to_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_health.exporter import check
    seen: list[dict[str, Any]] = []

    def fake_verify(url: str, *, api_key: str = "", **kw: Any) -> Verification:
        seen.append({**kw, **({"api_key": api_key} if api_key else {})})
        return Verification("idle_ok", "fake")
    monkeypatch.setattr(check, "verify", fake_verify)
    (tmp_path / "key").write_text("  s3cret \n")
    config = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                           "exporter": {"api_key_file": "key"}}, source=str(tmp_path / "x.yml"))
    verify = backend_io.default_verifier(config)
    (tmp_path / "key").write_text("changed")
    verify(config.backends[0])
    verify(config.backends[0])
    assert [kw["api_key"] for kw in seen] == ["s3cret", "s3cret"]
    assert seen[0]["readings"] == 3 and seen[0]["interval"] == 10.0
    missing = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                            "exporter": {"api_key_file": "nope"}}, source=str(tmp_path / "x.yml"))
    v = backend_io.default_verifier(missing)(missing.backends[0])
    assert v.outcome == "unknown" and "unreadable" in v.reason
    plain = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    backend_io.default_verifier(plain)(plain.backends[0])
    assert "api_key" not in seen[-1]


def test_older_state_file_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, backend TEXT NOT NULL, "
                  "state TEXT NOT NULL, opened_at REAL NOT NULL, updated_at REAL NOT NULL, closed_at REAL, "
                  "close_reason TEXT NOT NULL DEFAULT '', next_check_at REAL NOT NULL DEFAULT 0, "
                  "last_note TEXT NOT NULL DEFAULT '', warm_deadline REAL, last_decision TEXT NOT NULL DEFAULT '')")
    store = SqliteStore(path)
    store.init()
    cols = {r[1] for r in store.conn().execute("PRAGMA table_info(incidents)").fetchall()}
    assert {"verified_outcome", "verified_at", "unresponsive_since"} <= cols
    store.close()
