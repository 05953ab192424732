"""What the readiness sidecar answers the kubelet: pure (no I/O, no clock of its own).

`decide(answer, age, failure, engine, fallback_after)`:

* the remediator's latest answer decides while it is at most `fallback_after` seconds old: ready
  exactly when it says ready (its rule: READY and in service, remediator/agent_check.takes_traffic). A
  poll that fails in between keeps the answer it had: one lost call moves no pod;
* no answer for longer than that (unreachable, 5xx, not an answer, a name it does not know) and the
  engine's own /health decides: 200 is ready. Our outage must never take the whole fleet out, and a
  Service sends requests only to Ready pods;
* until the first answer (and for `fallback_after` after the sidecar started) the pod is not ready: it
  has just started, so its model is not warm yet either way.

`parse_answer()` turns the remediator's HTTP answer into an `Answer`, or into the reason it is none.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """The remediator's word on one backend (GET /api/backends/<name>/readiness)."""

    ready: bool
    lifecycle: str
    admin: str
    reason: str


@dataclass(frozen=True)
class Engine:
    """The engine's own GET /health: ok when it answered 200; `detail` says what came back."""

    ok: bool
    detail: str


class Source(enum.StrEnum):
    REMEDIATOR = "remediator"      # its answer, young enough
    WAITING = "waiting"            # no answer yet, fallback not due: not ready
    ENGINE = "engine"              # the fallback: the engine's /health


@dataclass(frozen=True)
class Decision:
    ready: bool
    source: Source
    reason: str

    @property
    def mode(self) -> tuple[bool, Source]:
        """What a change is logged on: ready or not, and who decided."""
        return self.ready, self.source


MAX_FIELD = 300


def parse_answer(status: int, body: bytes, backend: str) -> Answer | str:
    """The remediator's answer, or why it is none (then the fallback's clock runs on)."""
    if status == 404:
        return f"the remediator does not know backend {backend!r} (HTTP 404)"
    if status != 200:
        return f"the remediator answered HTTP {status}"
    try:
        data = json.loads(body)
    except ValueError:
        return "the remediator's answer is not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("ready"), bool) or data.get("backend") != backend:
        return "the remediator's answer is not a readiness answer for this backend"
    fields = [data.get(k, "") for k in ("lifecycle", "admin", "reason")]
    if not all(isinstance(f, str) for f in fields):
        return "the remediator's answer is not a readiness answer for this backend"
    lifecycle, admin, reason = (str(f)[:MAX_FIELD] for f in fields)
    return Answer(data["ready"], lifecycle, admin, reason)


def decide(answer: Answer | None, age: float, failure: str, engine: Engine | None,
           fallback_after: float) -> Decision:
    """`answer`: the latest one received (None: none yet); `age`: seconds since it came (since the
    sidecar started when none has); `failure`: why the latest poll brought none ('' when it did);
    `engine`: the latest /health check of the engine (None: not checked yet)."""
    if age <= fallback_after:
        if answer is None:
            return Decision(False, Source.WAITING, f"waiting for the remediator's first answer "
                            f"({failure or 'not asked yet'}); the engine's /health decides after {fallback_after:g}s")
        states = f"lifecycle {answer.lifecycle}, admin {answer.admin}"
        late = f"; latest poll failed ({failure}), answer {age:.0f}s old, fallback after {fallback_after:g}s" \
            if failure else ""
        said = "" if answer.ready else "not ready: "
        return Decision(answer.ready, Source.REMEDIATOR, f"remediator: {said}{answer.reason} ({states}){late}")
    why = f"no answer from the remediator for {age:.0f}s ({failure or 'no poll finished'})"
    if engine is None:
        return Decision(False, Source.ENGINE, f"fallback: {why}; the engine's /health not checked yet")
    return Decision(engine.ok, Source.ENGINE, f"fallback: {why}; the engine's /health: {engine.detail}")
