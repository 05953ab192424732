"""A step of the wall clock (an administrator, NTP) neither moves the lease nor freezes incidents: the
lease, the drain deadline, warm-up and the next look run on the monotonic clock; wall time only stamps
events. Two injected fake clocks, the Authority driven tick by tick."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes import FakeClock
from llm_health.remediator import action, fleet
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority, SimpleVerification
from llm_health.remediator.inflight import InFlight
from test_remediator_helpers import alert, payload

from llm_health.config import parse_config

TOKEN = "clock-token"


def test_wall_clock_steps_move_neither_lease_nor_deadlines(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18400", "restart": ["restart-a"]}],
        "remediator": {"state": "state.db", "token_file": "token", "poll_interval": 0.1, "warmup_poll": 5,
                       "stalled_drain_timeout": 5, "warmup_timeout": 100, "action_timeout": 30},
    }, source=str(tmp_path / "llm-health.yml"))
    wall, mono = FakeClock(1_000_000.0), FakeClock(5_000.0)
    app = create_app(config, clock=wall, start_authority=False)
    store = app.extensions["remediator"].store
    outcome = {"gpu-a": "no_progress"}
    calls: list[str] = []

    def runner(argv: Any, timeout: float, env: dict[str, str]) -> action.ActionResult:
        calls.append(env["LLM_HEALTH_BACKEND"])
        outcome["gpu-a"] = "progress"
        return action.ActionResult(action.OK, 0, "ok")

    def authority(holder: str) -> Authority:
        return Authority(store, config, clock=wall, mono=mono, runner=runner, holder=holder,
                         verifier=lambda b: SimpleVerification(outcome[b.name], "scripted"),
                         warmup_check=lambda b: (outcome[b.name] == "progress", "scripted"),
                         answer_check=lambda b: (True, "answers"),
                         in_flight=lambda b: InFlight(1.0, None, None, "busy, unreadable progress"))
    a, b = authority("a"), authority("b")

    def state() -> str:
        return fleet.state_of(store.conn(), "gpu-a").value

    assert a.renew_lease() and not b.renew_lease()
    a.tick()
    assert state() == "ready"
    client = app.test_client()
    assert client.post("/webhook", json=payload(alert("gpu-a")),
                       headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 202
    a.tick()
    assert state() == "draining"                       # stalled: 5 s drain (monotonic deadline)

    wall.advance(2 * 3600)                             # the wall clock jumps 2 h forward
    assert not b.renew_lease()                         # ... and the lease is still a's (mid-restart)
    assert a.renew_lease()
    a.tick()
    assert state() == "draining" and calls == []       # ... and the drain did not end early

    wall.advance(-4 * 3600)                            # now 2 h back
    mono.advance(5.1)                                  # the drain's 5 s pass on the monotonic clock
    assert a.renew_lease()
    a.tick()                                           # not frozen: the drain ends, the restart runs
    assert calls == ["gpu-a"] and state() == "initializing"
    mono.advance(5)
    a.tick()
    assert state() == "ready"
    kinds = [e["kind"] for e in store.events(backend="gpu-a", limit=100)]
    assert "recovered" in kinds and "interrupted" not in kinds
    restarted = store.events(backend="gpu-a", kind="restarted")[0]
    assert restarted["at"] == wall.t                   # events carry wall time (after the step back)

    # the lease expires on the monotonic clock only
    mono.advance(a.lease_ttl + 1)
    assert b.renew_lease() and not a.renew_lease()
