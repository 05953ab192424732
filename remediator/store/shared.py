"""Verbs every store implements the same way on top of its own primitives (no SQL here).

A store's transaction class mixes `SharedVerbs` in and provides the primitives (`_insert_event`,
`_recent_event`, `_insert_lifecycle`, `_put_lifecycle`, plus the verbs `bump` and `lifecycle`); the
domain rules (decision kinds are counted, a lifecycle moves only through `lifecycle.transition` and every
move is audited) are then written once, whatever the database.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from llm_health.exporter.reading import Reading
from llm_health.remediator.lifecycle import UNSEEN, IllegalTransition, LifecycleState, transition
from llm_health.remediator.store.details import DECISION_KINDS, encode_detail
from llm_health.remediator.store.rows import LifecycleRow

log = logging.getLogger("llm_health.remediator")

S = LifecycleState
REASON_LIMIT = 2000
FIRST_SEEN = "first seen: waiting for /health and /v1/models"


def clean_reason(reason: str) -> str:
    return reason[:REASON_LIMIT].encode("utf-8", "replace").decode()


def placed(started_at: float, started_mono: float | None, boot: str, *, now: float | None, mono: float | None,
           this_boot: str) -> float:
    """A restart's start as wall time for the policy: on this boot, `now` minus its monotonic age (a step of
    the wall clock moves no window); from another boot, the wall time it recorded (all there is)."""
    if now is not None and mono is not None and this_boot and boot == this_boot and started_mono is not None:
        return now - (mono - float(started_mono))
    return float(started_at)


class SharedVerbs:
    # primitives of the store (typed here for the verbs below)
    def _insert_event(self, at: float, kind: str, backend: str, incident_id: int | None, reason: str,
                      detail: str) -> None:
        raise NotImplementedError

    def _recent_event(self, kind: str, backend: str, reason: str, since: float) -> bool:
        raise NotImplementedError

    def _insert_lifecycle(self, backend: str, state: LifecycleState, at: float, reason: str) -> None:
        raise NotImplementedError

    def _put_lifecycle(self, row: LifecycleRow) -> None:
        raise NotImplementedError

    def bump(self, metric: str, label: str, by: int = 1) -> None:
        raise NotImplementedError

    def lifecycle(self, backend: str) -> LifecycleRow | None:
        raise NotImplementedError

    # -- the verbs ------------------------------------------------------------------------------------
    def event(self, at: float, kind: str, backend: str = "", incident_id: int | None = None, reason: str = "",
              **detail: Any) -> None:
        self._insert_event(at, kind, backend, incident_id, clean_reason(reason), encode_detail(detail))
        if kind in DECISION_KINDS:
            self.bump("decisions", kind)

    def event_unless_recent(self, at: float, kind: str, backend: str, reason: str, within: float,
                            **detail: Any) -> bool:
        if self._recent_event(kind, backend, reason[:REASON_LIMIT], at - within):
            return False
        self.event(at, kind, backend, None, reason, **detail)
        return True

    def ensure_lifecycle(self, backend: str, at: float) -> LifecycleRow:
        row = self.lifecycle(backend)
        if row is None:
            self._insert_lifecycle(backend, UNSEEN, at, FIRST_SEEN)
            row = self.lifecycle(backend)
            assert row is not None
        return row

    def move_lifecycle(self, backend: str, target: LifecycleState, at: float, reason: str,
                       incident_id: int | None = None, *, drain_deadline: float | None = None,
                       drain_baseline: Reading | None = None) -> bool:
        current = self.ensure_lifecycle(backend, at)
        try:
            t = transition(current.state, target, at, reason)
        except IllegalTransition as exc:
            log.warning("%s: %s", backend, exc)
            self.event(at, "lifecycle_refused", backend, incident_id, reason=str(exc),
                       source=current.state.value, target=LifecycleState(target).value)
            return False
        if t.target in (S.READY, S.ERROR):
            owner = None                          # no restart owns the state any more
        else:
            owner = incident_id if incident_id is not None else current.incident_id
        self._put_lifecycle(dataclasses.replace(current, state=t.target, since=t.at, reason=t.reason,
                                                incident_id=owner, drain_deadline=drain_deadline,
                                                drain_baseline=drain_baseline))
        self.event(at, "lifecycle", backend, incident_id, reason=f"{t.source.value} -> {t.target.value}: {t.reason}",
                   source=t.source.value, target=t.target.value)
        return True
