"""The audit-log kinds of rolling operations (events.kind; the values never change)."""

from __future__ import annotations

import enum


class Kind(enum.StrEnum):
    STARTED = "rollout_started"
    REFUSED = "rollout_refused"
    MEMBER_RESTART = "rollout_member_restart"       # a member's restart with the new command was asked for
    SOAK_STARTED = "rollout_soak_started"
    MEMBER_DONE = "rollout_member_done"
    MEMBER_FAILED = "rollout_member_failed"
    GATE = "rollout_gate"                           # one measurement that decided nothing (kept once per reason)
    GATE_PASSED = "rollout_gate_passed"
    GATE_FAILED = "rollout_gate_failed"
    ROLLING_BACK = "rollout_rolling_back"
    ROLLBACK_RESTART = "rollout_rollback_restart"   # a member's restart with its previous command was asked for
    ROLLED_BACK_MEMBER = "rollout_member_rolled_back"
    CALLED_OFF = "rollout_restart_called_off"       # a member's restart that had not begun, closed
    PAUSED = "rollout_paused"
    RESUMED = "rollout_resumed"
    ABORTED = "rollout_aborted"
    SUCCEEDED = "rollout_succeeded"
    ROLLED_BACK = "rollout_rolled_back"
    FAILED = "rollout_failed"
    ACKNOWLEDGED = "rollout_acknowledged"
