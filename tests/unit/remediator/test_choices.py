"""The procedure's next-state choices, without a store or a clock (remediator/restart/choices.py)."""

from __future__ import annotations

import pytest

from llm_health.config import RemediatorSettings
from llm_health.exporter.observation import VerifyOutcome
from llm_health.remediator import action as act
from llm_health.remediator import policy
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart import choices as ch

S = LifecycleState
V = VerifyOutcome


def decision(kind: str, reason: str = "why", retry_at: float | None = None) -> policy.Decision:
    return policy.Decision(kind, reason, retry_at=retry_at)


# -- before a restart -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("state", "outcome", "begin"), [
    (S.READY, V.NO_PROGRESS, ch.Begin.DRAIN),            # serving: drain first
    (S.READY, V.UNRESPONSIVE, ch.Begin.DRAIN),
    (S.READY, V.DOWN, ch.Begin.STOP_THEN_CLAIM),         # serves nothing: no drain
    (S.ERROR, V.NO_PROGRESS, ch.Begin.CLAIM),            # not READY: claim at once
    (S.INITIALIZING, V.DOWN, ch.Begin.CLAIM),
])
def test_how_a_restart_begins(state: LifecycleState, outcome: VerifyOutcome, begin: ch.Begin) -> None:
    assert ch.how_to_begin(state, outcome) == begin


def test_a_stalled_backend_drains_for_the_stalled_timeout_only() -> None:
    r = RemediatorSettings(drain_timeout=300, stalled_drain_timeout=30)
    assert ch.drain_timeout(V.NO_PROGRESS, r) == (30, True)
    assert ch.drain_timeout(V.UNRESPONSIVE, r) == (30, True)
    assert ch.drain_timeout(V.DOWN, r) == (300, False)


def test_unresponsive_counts_consecutive_samples_only() -> None:
    assert ch.unresponsive_run(V.UNRESPONSIVE, None, None, 100.0, 60.0) == (100.0, 100.0)     # first sample
    assert ch.unresponsive_run(V.UNRESPONSIVE, 100.0, 100.0, 150.0, 60.0) == (100.0, 150.0)   # unbroken
    assert ch.unresponsive_run(V.UNRESPONSIVE, 100.0, 150.0, 400.0, 60.0) == (400.0, 400.0)   # a gap: over
    assert ch.unresponsive_run(V.NO_PROGRESS, 100.0, 150.0, 160.0, 60.0) == (None, None)      # the run ends


@pytest.mark.parametrize(("state", "claim"), [
    (S.ERROR, ch.Claim.FROM_ERROR), (S.INITIALIZING, ch.Claim.TAKE_OVER), (S.STOPPED, ch.Claim.KEEP),
    (S.READY, ch.Claim.KEEP),
])
def test_what_a_claim_does_to_the_lifecycle(state: LifecycleState, claim: ch.Claim) -> None:
    assert ch.claim_lifecycle(state) == claim


# -- decisions that are not a restart ----------------------------------------------------------------------
def test_what_a_decision_that_is_not_a_restart_does() -> None:
    assert ch.note_kind(decision(policy.VERIFIED_HEALTHY)) == ch.Note.CLOSE
    assert ch.note_kind(decision(policy.RESTARTED_BY_OTHER)) == ch.Note.CLOSE
    assert ch.note_kind(decision(policy.WOULD_RESTART)) == ch.Note.DRY_RUN
    assert ch.note_kind(decision(policy.NOT_CONFIGURED)) == ch.Note.OBSERVE
    assert ch.note_kind(decision(policy.DEFERRED_BACKOFF)) == ch.Note.DEFER


def test_a_deferral_is_the_same_while_the_same_marker_holds_it() -> None:
    a = decision(policy.DEFERRED_MARKER, "busy marker m1 by 'x' until 1000 (40s left)")
    b = decision(policy.DEFERRED_MARKER, "busy marker m1 by 'x' until 1000 (10s left)")
    c = decision(policy.DEFERRED_MARKER, "busy marker m2 by 'y' until 2000 (10s left)")
    assert ch.deferral_key(a) == ch.deferral_key(b) != ch.deferral_key(c)
    assert ch.deferral_key(decision(policy.DEFERRED_BUDGET, "2 of 3")) == policy.DEFERRED_BUDGET


def test_only_timed_deferrals_name_their_next_look_on_the_monotonic_clock() -> None:
    # wall 1000 = monotonic 50: a retry at wall 1030 is a look at monotonic 80
    assert ch.deferral_next_check(decision(policy.DEFERRED_UNKNOWN, retry_at=1030.0), 1000.0, 50.0) == 80.0
    assert ch.deferral_next_check(decision(policy.DEFERRED_MIN_READY, retry_at=1030.0), 1000.0, 50.0) == 80.0
    assert ch.deferral_next_check(decision(policy.DEFERRED_BACKOFF, retry_at=1030.0), 1000.0, 50.0) == 0.0
    assert ch.deferral_next_check(decision(policy.DEFERRED_UNKNOWN), 1000.0, 50.0) == 0.0


# -- how a drain ends -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("moved", "drained", "t", "deadline", "step"), [
    ("", False, 10.0, 20.0, ch.Drain.WAIT),                  # work in flight, before the deadline
    ("", True, 10.0, 20.0, ch.Drain.ENDED),                  # nothing in flight any more
    ("", False, 20.0, 20.0, ch.Drain.ENDED),                 # the deadline
    ("", False, 10.0, None, ch.Drain.ENDED),                 # no deadline recorded: over
    ("engine 0 progressed", False, 10.0, 20.0, ch.Drain.CALL_OFF),   # progress wins, deadline or not
    ("engine 0 progressed", True, 30.0, 20.0, ch.Drain.CALL_OFF),
])
def test_how_a_drain_goes_on(moved: str, drained: bool, t: float, deadline: float | None, step: ch.Drain) -> None:
    assert ch.drain_progress(moved, drained, t, deadline) == step


def test_how_a_drain_without_progress_ends() -> None:
    assert ch.drain_end(blocked=True, reverified=True, needs_recheck=True) == ch.DrainEnd.CALL_OFF
    assert ch.drain_end(blocked=False, reverified=True, needs_recheck=False) == ch.DrainEnd.DECIDE
    assert ch.drain_end(blocked=False, reverified=False, needs_recheck=True) == ch.DrainEnd.RECHECK
    assert ch.drain_end(blocked=False, reverified=False, needs_recheck=False) == ch.DrainEnd.CLAIM


@pytest.mark.parametrize(("kind", "firing", "meaning"), [
    (policy.RESTART, 0, ch.Recheck.RESTART),                 # still restart-worthy, resolved or not
    (policy.RESTART, 2, ch.Recheck.RESTART),
    (policy.VERIFIED_HEALTHY, 0, ch.Recheck.CLOSE),
    (policy.VERIFIED_ASLEEP, 1, ch.Recheck.CLOSE),
    (policy.DEFERRED_UNKNOWN, 0, ch.Recheck.RESOLVED),       # cannot confirm, nothing fires: no restart
    (policy.DEFERRED_UNKNOWN, 1, ch.Recheck.REOPEN),         # cannot confirm, still firing: open again
])
def test_what_the_verification_at_the_end_of_a_drain_means(kind: str, firing: int, meaning: ch.Recheck) -> None:
    assert ch.after_recheck(decision(kind), firing) == meaning


# -- the action and after ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("result", "end"), [
    (act.ActionResult(act.OK, 0, ""), ch.ActionEnd.WARM_UP),
    (act.ActionResult(act.FAILED, 3, ""), ch.ActionEnd.FAILED),          # did not happen: retry after backoff
    (act.ActionResult(act.TIMEOUT, None, ""), ch.ActionEnd.UNKNOWN),     # may have happened: never repeated
    (act.ActionResult(act.UNKNOWN, None, ""), ch.ActionEnd.UNKNOWN),
])
def test_what_an_actions_result_leads_to(result: act.ActionResult, end: ch.ActionEnd) -> None:
    assert ch.after_action(result) == end


def test_an_unknown_outcome_says_why() -> None:
    assert ch.unknown_outcome(act.ActionResult(act.TIMEOUT, None, ""), 600) == "timed out after 600s"
    assert ch.unknown_outcome(act.ActionResult(act.UNKNOWN, None, ""), 600) == "ended without an exit status"


def test_a_warm_up_check_that_ran_past_the_deadline_times_out_at_once() -> None:
    assert ch.warmup_after_check(True, 200.0, 100.0) == ch.Warmup.WARM      # warm wins even late
    assert ch.warmup_after_check(False, 99.0, 100.0) == ch.Warmup.WAIT
    assert ch.warmup_after_check(False, 101.0, 100.0) == ch.Warmup.TIMED_OUT


def test_lifecycle_steps_of_a_backend_found_warm() -> None:
    assert ch.moves_when_warm(S.INITIALIZING, from_error=False) == (S.READY,)
    assert ch.moves_when_warm(S.ERROR, from_error=False) == ()                # a warm-up never leaves ERROR
    assert ch.moves_when_warm(S.ERROR, from_error=True) == (S.INITIALIZING, S.READY)
    assert ch.moves_when_warm(S.STOPPED, from_error=True) == (S.INITIALIZING, S.READY)
    assert ch.moves_when_warm(S.READY, from_error=True) == ()


def test_backends_outside_a_restart() -> None:
    assert ch.outside_restart(S.INITIALIZING, True, 0.0, 10.0, 100.0) == ((S.READY,), False)
    assert ch.outside_restart(S.ERROR, True, 0.0, 10.0, 100.0) == ((S.INITIALIZING, S.READY), False)
    assert ch.outside_restart(S.INITIALIZING, False, 0.0, 99.0, 100.0) == ((), False)
    assert ch.outside_restart(S.INITIALIZING, False, 0.0, 100.0, 100.0) == ((S.ERROR,), True)   # never ready
    assert ch.outside_restart(S.ERROR, False, 0.0, 1e9, 100.0) == ((), False)                    # stays ERROR


def test_a_drained_backend_is_held_for_drain_min_but_never_past_the_deadline() -> None:
    from llm_health.remediator.restart.choices import Drain, drain_progress
    assert drain_progress("", True, 10.0, 100.0, held_for=3.0, drain_min=15.0) == Drain.WAIT
    assert drain_progress("", True, 10.0, 100.0, held_for=15.0, drain_min=15.0) == Drain.ENDED
    assert drain_progress("", True, 100.0, 100.0, held_for=3.0, drain_min=15.0) == Drain.ENDED   # the deadline wins
    assert drain_progress("", False, 10.0, 100.0, held_for=50.0, drain_min=15.0) == Drain.WAIT   # work in flight
    assert drain_progress("tokens moved", True, 10.0, 100.0, held_for=3.0, drain_min=15.0) == Drain.CALL_OFF
    assert drain_progress("", True, 10.0, 100.0) == Drain.ENDED                                  # drain_min 0: as before
