"""A step of the wall clock (an administrator, NTP) neither moves the lease nor freezes incidents: the
lease, the drain deadline, warm-up and the next look run on the monotonic clock; wall time only stamps
events. Two injected fake clocks, the Authority driven tick by tick."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llm_health.config import parse_config
from llm_health.exporter.observation import Verification
from llm_health.remediator import action
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from tests.support import stores
from tests.support.alerts import alert, one_pass, payload
from tests.support.fakes import FakeClock
from tests.support.remediator import AUTH, World, build

TOKEN = "clock-token"


def test_wall_clock_steps_move_neither_lease_nor_deadlines(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18400", "restart": ["restart-a"]}],
        "remediator": {"state": "state.db", "token_file": "token", "poll_interval": 0.1, "warmup_poll": 5,
                       "stalled_drain_timeout": 5, "warmup_timeout": 100, "action_timeout": 30},
    }, source=str(tmp_path / "llm-health.yml"))
    wall, mono = FakeClock(1_000_000.0), FakeClock(5_000.0)
    app = create_app(config, clock=wall, with_authority=False)
    store = app.extensions["remediator"].store
    outcome = {"gpu-a": "no_progress"}
    calls: list[str] = []

    def runner(argv: Any, timeout: float, env: dict[str, str]) -> action.ActionResult:
        calls.append(env["LLM_HEALTH_BACKEND"])
        outcome["gpu-a"] = "progress"
        return action.ActionResult(action.OK, 0, "ok")

    def authority(holder: str) -> Authority:
        return Authority(store, config, clock=wall, mono=mono, runner=runner, holder=holder,
                         verifier=lambda b: Verification(outcome[b.name], "scripted"),
                         warmup_check=lambda b: (outcome[b.name] == "progress", "scripted"),
                         first_seen_check=lambda b: (True, "answers"),
                         in_flight=lambda b: InFlight(1.0, None, None, "busy, unreadable progress"))
    a, b = authority("a"), authority("b")

    def state() -> str:
        return store.lifecycle_state("gpu-a").value

    assert a.lease.renew() and not b.lease.renew()
    one_pass(a)
    assert state() == "ready"
    client = app.test_client()
    assert client.post("/webhook", json=payload(alert("gpu-a")),
                       headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 202
    one_pass(a)
    assert state() == "draining"                       # stalled: 5 s drain (monotonic deadline)

    wall.advance(2 * 3600)                             # the wall clock jumps 2 h forward
    assert not b.lease.renew()                         # ... and the lease is still a's (mid-restart)
    assert a.lease.renew()
    one_pass(a)
    assert state() == "draining" and calls == []       # ... and the drain did not end early

    wall.advance(-4 * 3600)                            # now 2 h back
    mono.advance(5.1)                                  # the drain's 5 s pass on the monotonic clock
    assert a.lease.renew()
    one_pass(a)                                           # not frozen: the drain ends, the restart runs
    assert calls == ["gpu-a"] and state() == "initializing"
    mono.advance(5)
    one_pass(a)
    assert state() == "ready"
    kinds = [e.kind for e in store.events(backend="gpu-a", limit=100)]
    assert "recovered" in kinds and "interrupted" not in kinds
    restarted = store.events(backend="gpu-a", kind="restarted")[0]
    assert restarted.at == wall.t                   # events carry wall time (after the step back)

    # the lease expires on the monotonic clock only
    mono.advance(a.lease.ttl + 1)
    assert b.lease.renew() and not a.lease.renew()


def rig(tmp_path: Path, **remediator: Any) -> World:
    """One backend, two fake clocks, a scripted verifier; each restart fixes nothing (it stalls again)."""
    settings = {"state": "state.db", "token_file": "token", "poll_interval": 0.1, "warmup_poll": 1,
                "warmup_timeout": 100, "action_timeout": 30, "verify_interval": 10, "verify_readings": 3,
                "backoff": {"initial": 300, "factor": 1, "cap": 300, "stable_after": 100_000},
                "budget": {"restarts": 100, "window": 3600}, "breaker": {"restarts": 100, "window": 3600},
                **remediator}
    document = {
        "backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18401", "restart": ["restart-a"], "host": "node-1"},
                     {"name": "gpu-b", "url": "http://127.0.0.1:18402", "restart": ["restart-b"], "host": "node-1"}],
        "remediator": settings,
    }
    return build(tmp_path, document, outcomes={"gpu-a": "down", "gpu-b": "progress"},
                 ready={"gpu-a": True, "gpu-b": True}, first_seen_check=lambda b: (True, "answers"),
                 in_flight=lambda b: InFlight(0.0, None, None, "idle"), mono=FakeClock(5_000.0), holder="a")


def fire(r: World, backend: str = "gpu-a", starts_at: str = "2026-12-01T00:00:00Z") -> None:
    r.deliver(payload(alert(backend, starts_at=starts_at)))


def test_a_forward_step_of_the_wall_clock_never_allows_a_restart_inside_the_backoff(tmp_path: Path) -> None:
    """The finding: a +400 s step allowed a restart inside a 300 s backoff."""
    r = rig(tmp_path)
    r.run()
    fire(r)
    r.run()
    assert r.restarted == ["gpu-a"]                        # restarted at once (down), warm, incident closed
    assert "recovered" in r.kinds("gpu-a")
    r.clock.advance(400)                                # the wall clock jumps; only 10 s really pass
    r.mono.advance(10)
    fire(r, starts_at="2026-12-01T00:10:00Z")          # stalled again: a new incident
    r.run()
    assert r.restarted == ["gpu-a"], "restarted again 10 s after the last restart, inside a 300 s backoff"
    assert "deferred_backoff" in r.kinds("gpu-a")
    r.mono.advance(300)                                # the backoff really passes
    r.clock.advance(300)
    r.run()
    assert r.restarted == ["gpu-a", "gpu-a"]


def test_a_backward_step_of_the_wall_clock_never_defers_restarts_for_hours(tmp_path: Path) -> None:
    """The finding: a -7200 s step deferred restarts for 7800 s."""
    r = rig(tmp_path)
    r.run()
    fire(r)
    r.run()
    assert r.restarted == ["gpu-a"]
    r.clock.advance(-7200)
    r.mono.advance(310)                                # past the 300 s backoff on the monotonic clock
    fire(r, starts_at="2026-12-01T00:10:00Z")
    r.run()
    assert r.restarted == ["gpu-a", "gpu-a"], r.kinds("gpu-a")


def test_the_breaker_counts_restarts_after_its_reset_whatever_the_wall_clock_did(tmp_path: Path) -> None:
    r = rig(tmp_path, breaker={"restarts": 2, "window": 3600},
            backoff={"initial": 0, "factor": 1, "cap": 0, "stable_after": 100_000})
    r.run()
    for i in range(2):
        fire(r, starts_at=f"2026-12-01T00:0{i}:00Z")
        r.run()
        r.mono.advance(5)
        r.clock.advance(5)
    assert r.restarted == ["gpu-a", "gpu-a"]
    fire(r, starts_at="2026-12-01T00:05:00Z")
    r.run()
    assert r.restarted == ["gpu-a", "gpu-a"] and "breaker_open" in r.kinds("gpu-a")
    r.clock.advance(-7200)                              # a step back: the reset's wall time is "in the future"
    assert r.client.post("/api/breaker/reset", headers=AUTH).status_code == 200
    r.clock.advance(7200 + 60)                          # ... and forward again past it
    r.mono.advance(60)
    r.run()
    # the two restarts before the reset no longer count; with a wall-time reset point they would again
    assert r.restarted == ["gpu-a", "gpu-a", "gpu-a"], r.kinds("gpu-a")


def test_unresponsive_is_held_only_across_consecutive_samples(tmp_path: Path) -> None:
    """The finding: "unresponsive for 301 s" from two samples 300 s apart (the backend was deferred by its
    host's mutex in between, with no check at all), followed by a drain and a restart."""
    r = rig(tmp_path, unresponsive_after=120, warmup_timeout=1000)
    r.outcomes["gpu-a"] = "unresponsive"
    r.run()
    fire(r)
    r.run(1)
    assert r.restarted == [] and "deferred_unknown" in r.kinds("gpu-a")     # first sample of a hung server
    # gpu-b (same host) is restarted meanwhile: gpu-a waits for the host's mutex, nobody checks it
    r.outcomes["gpu-b"] = "down"
    r.ready["gpu-b"] = False
    fire(r, "gpu-b")
    r.mono.advance(10)
    r.clock.advance(10)
    r.run(1)
    assert "restarting" in r.kinds("gpu-b")
    for _ in range(29):                                # 290 s of gpu-b's warm-up: gpu-a is deferred by the host
        r.mono.advance(10)
        r.clock.advance(10)
        r.run(1)
    assert "deferred_host" in r.kinds("gpu-a") and r.restarted == ["gpu-b"]
    r.ready["gpu-b"] = True
    r.mono.advance(10)
    r.clock.advance(10)
    r.run(3)                                          # gpu-b warm: the host is free, gpu-a is verified again
    assert r.restarted == ["gpu-b"], "restarted on two unresponsive samples 300 s apart"
    inc = stores.sql(r.store).execute("SELECT * FROM incidents WHERE backend = 'gpu-a' AND state = 'open'").fetchone()
    assert inc["verified_outcome"] == "unresponsive" and inc["unresponsive_since"] == r.mono.t  # run started over
    for _ in range(14):                                # consecutive samples for 120 s more: now it is restarted
        r.mono.advance(10)
        r.clock.advance(10)
        r.run(1)
    assert r.restarted == ["gpu-b", "gpu-a"], r.kinds("gpu-a")
