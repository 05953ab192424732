"""A rollout and the operators' other commands at the same time: a restart asked for by hand, a pause, while
a member's restart with the new command is asked for and has not begun (held by a gate of the authority)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.remediator import AUTH
from tests.unit.remediator.rollout.test_procedure import NEW, Gate, rollout, start, steps, world

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

OPS = {"by": "ops2", "reason": "a1 looks slow"}


def test_a_restart_by_hand_never_takes_over_a_members_restart_with_the_new_command(tmp_path: Path) -> None:
    """It did: the operator's request replaced the rollout's incident and dropped its new command, a1
    restarted on the old one, and the canary was soaked and passed on the old version."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.authority.rollouts.look(rid)            # canary a1: its restart with the new command asked for, not begun
    assert w.incident("a1").state.value == "open" and w.incident("a1").command is not None
    r = w.client.post("/api/backends/a1/restart", json=OPS, headers=AUTH)
    assert r.status_code == 409 and f"rollout {rid}" in r.get_json()["error"], r.get_json()
    assert w.incident("a1").command is not None and w.incident("a1").requested_by != "ops2"
    assert "operator_refused" in w.kinds("a1")
    w.run_until(lambda: steps(w, rid)["a1"] != "restarting", "a1's restart ended", timeout=60)
    assert w.calls[0] == tuple(NEW[:3]) + ("a1", "node-1"), (w.calls, steps(w, rid))
    assert rollout(w, rid)["state"] == "running"


def test_the_canary_is_measured_at_the_end_of_its_soak_whatever_the_gate_interval(tmp_path: Path) -> None:
    """A gate interval longer than the soak (a short soak with the default interval, or any value asked for):
    the canary was measured once, and soaked on (running) until someone aborted the rollout."""
    gate = Gate()
    w = world(tmp_path, gate)
    rid = start(w, soak=5, gate={"interval": 1e9}).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "soaking", "soaking")
    for _ in range(8):                        # 8 s of the fake clock: the soak ends at 5 s
        w.run(1)
        w.pass_time(1)
    assert steps(w, rid)["a1"] == "done" and gate.summaries, (len(gate.measured), rollout(w, rid)["members"][0])


def test_pause_holds_a_member_whose_restart_was_asked_for_but_has_not_begun(tmp_path: Path) -> None:
    """It did not: a member's restart held back by the breaker when the rollout was paused ran the new
    command once the breaker was reset, the rollout still 'paused'. Now it goes back to pending and starts
    when the rollout is resumed."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.authority.rollouts.look(rid)                       # canary a1's restart asked for ...
    with w.store.tx() as tx:
        tx.open_breaker(w.clock(), "other failures")    # ... and held back: nothing has begun
    w.run(3)
    assert w.calls == [] and w.incident("a1").state.value == "open"
    body = {"by": "ops@host1", "reason": "stop everything, the new image is suspect"}
    assert w.client.post(f"/api/rollouts/{rid}/pause", json=body, headers=AUTH).get_json()["state"] == "paused"
    with w.store.tx() as tx:
        tx.reset_breaker(w.clock())
    w.run(10)
    assert rollout(w, rid)["state"] == "paused" and steps(w, rid)["a1"] == "pending"
    assert w.calls == [], "a paused rollout started a member's restart with the new command"
    assert w.client.post(f"/api/rollouts/{rid}/resume", json=body, headers=AUTH).get_json()["state"] == "running"
    w.run_until(lambda: steps(w, rid)["a1"] in ("soaking", "done"), "the canary restarts after the resume", timeout=60)
    assert w.calls[0] == tuple(NEW[:3]) + ("a1", "node-1")


def test_a_claim_between_the_pause_and_the_rollouts_next_look_waits(tmp_path: Path) -> None:
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.authority.rollouts.look(rid)                       # canary a1's restart asked for, not begun
    body = {"by": "ops@host1", "reason": "hold on"}
    assert w.client.post(f"/api/rollouts/{rid}/pause", json=body, headers=AUTH).get_json()["state"] == "paused"
    w.authority.work("a1")                               # the claim, before the rollout's look
    assert w.calls == [] and w.incident("a1").last_decision == "deferred_paused", w.incident("a1")
    assert "deferred_paused" in w.kinds("a1")


def _soaking(tmp_path: Path, gate: Gate) -> tuple[Any, int, Any]:
    """A rollout with a 600 s soak, its canary a1 soaking; the wall and monotonic clocks apart."""
    from llm_health.remediator.rollout.procedure import Procedure
    from tests.support.fakes import FakeClock
    from tests.support.remediator import build
    from tests.unit.remediator.rollout.test_procedure import HOSTS

    names = tuple(HOSTS)
    doc = {"backends": [{"name": n, "url": f"http://127.0.0.1:{18100 + i}", "host": HOSTS[n],
                         "restart": [f"restart-{n}"]} for i, n in enumerate(names)],
           "remediator": {"state": "state.db", "token_file": "token", "verify_interval": 0.2, "poll_interval": 0.1,
                          "warmup_timeout": 100, "warmup_poll": 5, "action_timeout": 30, "drain_timeout": 60,
                          "stalled_drain_timeout": 5, "min_ready": 2,
                          "rollout": {"prometheus_url": "http://127.0.0.1:9", "gate_interval": 1}}}
    mono = FakeClock(5000.0)
    w = build(tmp_path, doc, outcomes=dict.fromkeys(names, "no_progress"), ready=dict.fromkeys(names, True),
              scripted_serving=True, holder="test", first_look=True, mono=mono)
    for n in names:
        w.work[n] = 0.0
    w.authority.rollouts = Procedure(w.authority.ctx, gate)
    rid = w.client.post("/api/rollouts", json={"command": NEW, "by": "ops", "reason": "v2", "soak": 600},
                        headers=AUTH).get_json()["id"]
    for _ in range(40):
        if steps(w, rid)["a1"] == "soaking":
            break
        w.run(1)
        w.clock.advance(0.5)
        mono.advance(0.5)
    assert steps(w, rid)["a1"] == "soaking"
    return w, rid, mono


def _soak_for(w: Any, mono: Any, looks: int, seconds: float) -> None:
    for _ in range(looks):
        w.run(1)
        mono.advance(seconds)
        w.clock.advance(seconds)


def test_the_soak_is_not_cut_short_by_a_wall_clock_step(tmp_path: Path) -> None:
    """The soak was timed on the wall clock: a step (NTP) ended it at once, and the canary passed after 2 s of
    real time."""
    gate = Gate()
    w, rid, mono = _soaking(tmp_path, gate)
    w.clock.advance(600)          # the wall clock steps; 2 s of real (monotonic) time pass below
    for _ in range(4):
        w.run(1)
        mono.advance(0.5)
    assert gate.summaries == [] and steps(w, rid)["a1"] == "soaking", (gate.summaries, steps(w, rid))
    _soak_for(w, mono, 32, 20)    # the rest of the soak, on the monotonic clock (and the wall clock with it)
    assert steps(w, rid)["a1"] == "done" and gate.summaries[0][2] == 600


def test_a_new_worker_goes_on_with_the_soak_from_its_stored_start(tmp_path: Path) -> None:
    """A reload (gunicorn's new workers) or the lease moving between workers: the soak goes on from its
    stored start, it does not begin again."""
    from llm_health.remediator.rollout.procedure import Procedure

    gate = Gate()
    w, rid, mono = _soaking(tmp_path, gate)
    _soak_for(w, mono, 29, 20)    # 580 s soaked
    assert steps(w, rid)["a1"] == "soaking"
    w.authority.rollouts = Procedure(w.authority.ctx, gate)
    _soak_for(w, mono, 3, 20)
    assert steps(w, rid)["a1"] == "done", "the soak started over in the new worker"


def test_retiring_a_member_that_is_not_done_is_refused_and_the_rollout_goes_on(tmp_path: Path) -> None:
    """It was taken: the rollout then asked for the retired b2's restart, which was refused, and rolled back
    every changed member (each restarted once more)."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "done", "the canary passed", timeout=60)
    retire = {"by": "ops", "reason": "bad DIMM, out for good"}
    r = w.client.post("/api/backends/b2/retire", json=retire, headers=AUTH)
    assert r.status_code == 409 and f"rollout {rid}" in r.get_json()["error"], r.get_json()
    w.run_until(lambda: rollout(w, rid)["state"] not in ("running", "paused"), "the rollout ended", timeout=60)
    assert rollout(w, rid)["state"] == "succeeded", (rollout(w, rid)["note"], steps(w, rid))
    assert w.client.post("/api/backends/b2/retire", json=retire, headers=AUTH).status_code == 200   # done now


def test_a_restart_by_hand_after_a_failed_rollout_is_taken(tmp_path: Path) -> None:
    """The backend a failed rollout left needing a person still carries the rollback's command: the
    refusal above took it for a restart waiting to begin, and `ctl restart` (even forced) was refused for
    good, though the rollout was over."""
    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.ready["a1"] = False
    w.run_until(lambda: w.calls, "a1 restarted with the new command")
    w.clock.advance(200)
    w.run(3)
    w.run_until(lambda: len(w.calls) >= 2, "the rollback restart ran", timeout=60)
    w.clock.advance(200)
    w.run_until(lambda: rollout(w, rid)["state"] == "failed", "the rollout failed", timeout=60)
    assert w.incident("a1").state.value == "needs_ack"
    w.ready["a1"] = True
    r = w.client.post("/api/backends/a1/restart", json={"by": "ops", "reason": "host repaired"}, headers=AUTH)
    assert r.status_code == 200, r.get_json()


def test_retiring_a_done_member_of_a_running_rollout_is_refused_so_its_rollback_can_be_done(
        tmp_path: Path) -> None:
    """A done member retired while the rollout ran: when the rollout then rolled back, its rollback restart
    was refused (retired), the member ended rollback_failed and the rollout `failed` (paged, and new
    rollouts blocked until acknowledged)."""
    from llm_health.remediator import action

    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.run_until(lambda: steps(w, rid)["a1"] == "done", "the canary passed", timeout=60)
    r = w.client.post("/api/backends/a1/retire", json={"by": "ops", "reason": "bad DIMM"}, headers=AUTH)
    assert r.status_code == 409 and f"rollout {rid}" in r.get_json()["error"], r.get_json()
    w.result = action.ActionResult(action.FAILED, 3, "no such version")
    w.run_until(lambda: rollout(w, rid)["state"] == "rolling_back", "rolling back", timeout=60)
    w.result = action.ActionResult(action.OK, 0, "ok")
    w.run_until(lambda: rollout(w, rid)["state"] not in ("running", "paused", "rolling_back"), "ended", timeout=60)
    assert rollout(w, rid)["state"] == "rolled_back", (rollout(w, rid)["note"], steps(w, rid))


def test_an_alert_absorbed_into_a_restart_called_off_goes_on_in_an_incident_of_its_own(tmp_path: Path) -> None:
    """An alert that fired about a1 while its rollout's restart waited was absorbed into that incident; the
    pause (or a rollback) closed it, and the alert was lost until Alertmanager's next repeat, hours later."""
    from tests.support.alerts import alert, payload

    w = world(tmp_path, Gate())
    rid = start(w).get_json()["id"]
    w.authority.rollouts.look(rid)                       # canary a1's restart asked for ...
    with w.store.tx() as tx:
        tx.open_breaker(w.clock(), "other failures")    # ... and held back
    w.run(2)
    asked = w.incident("a1")
    w.deliver(payload(alert("a1")))                      # a1 stalls: its alert joins the waiting incident
    assert w.store.firing_alerts(asked.id) == 1
    body = {"by": "ops@host1", "reason": "hold on"}
    assert w.client.post(f"/api/rollouts/{rid}/pause", json=body, headers=AUTH).get_json()["state"] == "paused"
    w.authority.rollouts.look(rid)
    now = w.incident("a1")
    assert now is not None and now.id != asked.id and now.command is None and not now.requested_by, now
    assert w.store.firing_alerts(now.id) == 1
    assert steps(w, rid)["a1"] == "pending"
