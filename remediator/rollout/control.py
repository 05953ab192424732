"""Pause, resume and abort a rollout: an operator's word, decided and recorded in one transaction.

| command | running              | paused               | rolling back / ended |
|---------|----------------------|----------------------|----------------------|
| pause   | -> paused            | nothing to do        | refused              |
| resume  | nothing to do        | -> running           | refused              |
| abort   | -> rolling back      | -> rolling back      | refused              |
| ack     | refused              | refused              | failed -> acknowledged (a person repaired it); else refused |

Paused: no member starts; a restart under way finishes and a soaking canary stays watched (a failing
gate still rolls back: pausing never hides a bad canary). Abort rolls the changed members back, like a
failed gate.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llm_health.remediator.rollout.kinds import Kind
from llm_health.remediator.store import RolloutState, StateStore

RS = RolloutState


class Control(enum.StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    ABORT = "abort"
    ACK = "ack"


#: (command, state) -> the state it leads to; a state missing here refuses the command
MOVES: dict[tuple[Control, RolloutState], RolloutState] = {
    (Control.PAUSE, RS.RUNNING): RS.PAUSED,
    (Control.PAUSE, RS.PAUSED): RS.PAUSED,
    (Control.RESUME, RS.PAUSED): RS.RUNNING,
    (Control.RESUME, RS.RUNNING): RS.RUNNING,
    (Control.ABORT, RS.RUNNING): RS.ROLLING_BACK,
    (Control.ABORT, RS.PAUSED): RS.ROLLING_BACK,
    (Control.ACK, RS.FAILED): RS.ACKNOWLEDGED,
}
KINDS = {Control.PAUSE: Kind.PAUSED, Control.RESUME: Kind.RESUMED, Control.ABORT: Kind.ABORTED,
         Control.ACK: Kind.ACKNOWLEDGED}


@dataclass(frozen=True)
class Controlled:
    found: bool
    changed: bool = False
    refused: str = ""                # why not ('' = done)
    state: RolloutState | None = None


def control(store: StateStore, rollout_id: int, command: Control, by: str, reason: str, now: float) -> Controlled:
    with store.tx() as tx:
        r = tx.rollout(rollout_id)
        if r is None:
            return Controlled(False)
        target = MOVES.get((command, r.state))
        who = f"{by}: {reason}"
        if target is None:
            why = f"rollout {r.id} is {r.state.value}: {command.value} does not apply"
            tx.event(now, Kind.REFUSED, "", reason=f"{command.value} refused: {why}; asked by {who}", rollout_id=r.id,
                     by=by)
            return Controlled(True, refused=why, state=r.state)
        if target == r.state:
            return Controlled(True, False, state=r.state)
        note = {Control.PAUSE: f"paused by {who}", Control.RESUME: f"resumed by {who}",
                Control.ABORT: f"rolling back: aborted by {who}",
                Control.ACK: f"acknowledged by {who} (was: {r.note})"}[command]
        tx.move_rollout(r.id, now, target, note)
        tx.event(now, KINDS[command], "", reason=f"rollout {r.id} {note}", rollout_id=r.id, by=by)
        return Controlled(True, True, state=target)
