"""The procedure's next-state choices, pure (beside policy.decide): readings and times in, a choice out.

The steps read what these need, ask, and then write what the answer says; so "how a drain ends", "what
an action's result leads to" and "what a re-verification means" are tested without a store or a clock
(tests/unit/remediator/test_choices.py). `now` is wall time, `t` monotonic, as everywhere.
"""

from __future__ import annotations

import enum

from llm_health.config import RemediatorSettings
from llm_health.exporter.observation import VerifyOutcome
from llm_health.remediator import action as act
from llm_health.remediator import policy
from llm_health.remediator.lifecycle import LifecycleState, warmup_expired
from llm_health.remediator.sequence import HEADROOM_EXIT

S = LifecycleState
STALLED = (VerifyOutcome.NO_PROGRESS, VerifyOutcome.UNRESPONSIVE)


# -- before a restart -------------------------------------------------------------------------------------
class Begin(enum.Enum):
    DRAIN = "drain"                        # a serving backend: the load balancer drains it first
    STOP_THEN_CLAIM = "stop_then_claim"    # READY but verified down: nothing to drain
    CLAIM = "claim"                        # not serving (not READY): claim at once


def how_to_begin(state: LifecycleState, outcome: VerifyOutcome) -> Begin:
    if state == S.READY and outcome != VerifyOutcome.DOWN:
        return Begin.DRAIN
    return Begin.STOP_THEN_CLAIM if state == S.READY else Begin.CLAIM


def drain_timeout(outcome: VerifyOutcome, r: RemediatorSettings) -> tuple[float, bool]:
    """(how long the drain may take, whether the backend is stalled: it finishes nothing)."""
    stalled = outcome in STALLED
    return (r.stalled_drain_timeout if stalled else r.drain_timeout), stalled


def unresponsive_run(outcome: VerifyOutcome, since: float | None, seen_at: float | None, t: float,
                     gap: float) -> tuple[float | None, float | None]:
    """The incident's run of `unresponsive` after this verification at `t`: (first, latest) sample, both
    monotonic. Consecutive samples only: one further than `gap` from the previous starts the run over;
    any other outcome ends it."""
    if outcome != VerifyOutcome.UNRESPONSIVE:
        return None, None
    unbroken = since is not None and seen_at is not None and t - seen_at <= gap
    return (since if unbroken else t), t


class Claim(enum.Enum):
    FROM_ERROR = "from_error"      # ERROR -> INITIALIZING: the next restart starts from it
    TAKE_OVER = "take_over"        # INITIALIZING (never READY yet): the restart owns it now
    KEEP = "keep"


def claim_lifecycle(state: LifecycleState) -> Claim:
    return {S.ERROR: Claim.FROM_ERROR, S.INITIALIZING: Claim.TAKE_OVER}.get(state, Claim.KEEP)


# -- decisions that are not a restart ----------------------------------------------------------------------
class Note(enum.Enum):
    CLOSE = "close"                # verified healthy, asleep, restarted by someone else
    DRY_RUN = "dry_run"            # would restart: recorded, counted, observed
    OBSERVE = "observe"            # nothing configured to do
    DEFER = "defer"                # stays open; looked at again later


def note_kind(d: policy.Decision) -> Note:
    if d.kind in policy.NO_RESTART_CLOSES:
        return Note.CLOSE
    if d.kind == policy.WOULD_RESTART:
        return Note.DRY_RUN
    if d.kind == policy.NOT_CONFIGURED:
        return Note.OBSERVE
    return Note.DEFER


#: deferrals that name when to look again; the others are looked at on the next resync
TIMED_DEFERRALS = (policy.DEFERRED_UNKNOWN, policy.DEFERRED_MIN_READY)


def deferral_key(d: policy.Decision) -> str:
    """What makes two deferrals the same (audited once): the kind, and for a marker which one holds it."""
    return d.kind + (d.reason.split(" until ")[0] if d.kind == policy.DEFERRED_MARKER else "")


def deferral_next_check(d: policy.Decision, now: float, t: float) -> float:
    """When (monotonic) to look at a deferred incident again; 0 = at the next resync."""
    if d.kind in TIMED_DEFERRALS and d.retry_at:
        return t + (d.retry_at - now)          # policy answers in wall time
    return 0.0


# -- the drain ---------------------------------------------------------------------------------------------
class Drain(enum.Enum):
    WAIT = "wait"                  # work in flight, no progress, before the deadline
    CALL_OFF = "call_off"          # the engine moved: not stalled, no restart
    ENDED = "ended"                # drained, or the deadline passed


def drain_progress(moved: str, drained: bool, t: float, deadline: float | None, held_for: float = float("inf"),
                   drain_min: float = 0.0) -> Drain:
    """`moved`: why the engine evidently moved since the drain began ('' when it did not or cannot tell).
    `held_for`: how long the drain has lasted; a drained backend is held until `drain_min` (the time the
    load balancer needs to stop sending: a Kubernetes endpoint update after the readiness sidecar's next
    answer), never past the deadline."""
    if moved:
        return Drain.CALL_OFF
    if deadline is None or t >= deadline:
        return Drain.ENDED
    return Drain.ENDED if drained and held_for >= drain_min else Drain.WAIT


class DrainEnd(enum.Enum):
    CALL_OFF = "call_off"          # a gate closed meanwhile (marker, budget, breaker...): back to open
    RECHECK = "recheck"            # must be verified again first: at the next look
    DECIDE = "decide"              # verified again in this look: after_recheck() says what it means
    CLAIM = "claim"                # verified before the drain, nothing changed: restart


def drain_end(blocked: bool, reverified: bool, needs_recheck: bool) -> DrainEnd:
    """The drain ended without progress (Drain.ENDED). `needs_recheck`: no alert of the incident fires any
    more, or the drain has no starting reading (progress could not be seen): verify before acting."""
    if blocked:
        return DrainEnd.CALL_OFF
    if reverified:
        return DrainEnd.DECIDE
    return DrainEnd.RECHECK if needs_recheck else DrainEnd.CLAIM


class Recheck(enum.Enum):
    RESTART = "restart"
    CLOSE = "close"                # healthy, asleep, restarted by another: closed, no restart
    RESOLVED = "resolved"          # cannot confirm, and no alert fires any more: closed, no restart
    REOPEN = "reopen"              # cannot confirm, alerts still fire: back to open (a deferral)


def after_recheck(d: policy.Decision, firing: int) -> Recheck:
    """What the verification at the end of a drain means (`d`: policy.decide on it)."""
    if d.kind == policy.RESTART:
        return Recheck.RESTART
    if d.kind in policy.NO_RESTART_CLOSES:
        return Recheck.CLOSE
    return Recheck.REOPEN if firing else Recheck.RESOLVED


# -- the action and after ----------------------------------------------------------------------------------
class ActionEnd(enum.Enum):
    WARM_UP = "warm_up"            # exited 0: warming
    UNKNOWN = "unknown"            # timed out or vanished: may have happened, never repeated (needs_ack)
    FAILED = "failed"              # did not happen: ERROR, open again, next attempt after backoff
    NO_HEADROOM = "no_headroom"    # stopped, but the old process kept its room: ERROR, needs a person, no retry


def after_action(result: act.ActionResult, headroom: bool = False) -> ActionEnd:
    """`headroom`: the backend restarts through stop -> headroom -> start (remediator/sequence.py)."""
    if result.result == act.OK:
        return ActionEnd.WARM_UP
    if headroom and result.exit_code == HEADROOM_EXIT and not result.outcome_unknown:
        return ActionEnd.NO_HEADROOM
    return ActionEnd.UNKNOWN if result.outcome_unknown else ActionEnd.FAILED


def unknown_outcome(result: act.ActionResult, action_timeout: float) -> str:
    return f"timed out after {action_timeout:g}s" if result.result == act.TIMEOUT else "ended without an exit status"


class Warmup(enum.Enum):
    WARM = "warm"
    WAIT = "wait"
    TIMED_OUT = "timed_out"


def warmup_after_check(ready: bool, t: float, deadline: float) -> Warmup:
    """After a warm-up check at `t`: a check that ran past the deadline times the warm-up out at once."""
    if ready:
        return Warmup.WARM
    return Warmup.TIMED_OUT if t > deadline else Warmup.WAIT


def moves_when_warm(state: LifecycleState, *, from_error: bool) -> tuple[LifecycleState, ...]:
    """The lifecycle steps of a backend found warm: INITIALIZING -> READY; after an unknown outcome
    (`from_error`) also ERROR or STOPPED -> INITIALIZING -> READY."""
    if from_error and state in (S.ERROR, S.STOPPED):
        return (S.INITIALIZING, S.READY)
    return (S.READY,) if state == S.INITIALIZING else ()


# -- backends outside any restart --------------------------------------------------------------------------
def outside_restart(state: LifecycleState, ready: bool, since: float, now: float,
                    warmup_timeout: float) -> tuple[tuple[LifecycleState, ...], bool]:
    """A first-seen (INITIALIZING) or ERROR backend after its check: (lifecycle steps, escalate?)."""
    if ready:
        return ((S.INITIALIZING, S.READY) if state == S.ERROR else (S.READY,)), False
    if state == S.INITIALIZING and warmup_expired(since, now, warmup_timeout):
        return (S.ERROR,), True
    return (), False
