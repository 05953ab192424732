"""The lifecycle of one backend during a restart, and the gates that decide whether one may start.

Pure: no I/O, no clock of its own (every function takes `now`). The authority stores the current state
and calls `transition()` before it changes anything, so an illegal step is refused before it happens.

Legal transitions (anything else raises IllegalTransition):

| from         | to           | when                                                           |
|--------------|--------------|----------------------------------------------------------------|
| READY        | DRAINING     | a restart begins: the load balancer stops sending new work     |
| READY        | STOPPED      | the backend is already down: nothing to drain, skip the drain  |
| DRAINING     | STOPPED      | in-flight work finished (or the drain timeout ran out)         |
| DRAINING     | READY        | the restart was called off (re-verification saw progress)      |
| STOPPED      | INITIALIZING | the restart action ran; waiting for the model to be warm       |
| INITIALIZING | READY        | warm: /v1/models lists the model (also at start-up)            |
| INITIALIZING | ERROR        | warm-up timeout                                                |
| ERROR        | INITIALIZING | a manual or the next restart was started                       |
| any but ERROR| ERROR        | a failure (action failed, drain failed, ...)                   |

A backend the authority has never seen starts in INITIALIZING and becomes READY once it is warm.

The restart cycle is READY -> DRAINING -> STOPPED -> INITIALIZING -> READY.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


class LifecycleState(enum.StrEnum):
    INITIALIZING = "initializing"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    ERROR = "error"


S = LifecycleState

#: States in which a backend is out of service because a restart of ours holds it (and its host's mutex).
OUT_OF_SERVICE: frozenset[LifecycleState] = frozenset({S.DRAINING, S.STOPPED, S.INITIALIZING})

#: the state of a backend that has no lifecycle row yet (the authority has not looked at it)
UNSEEN = S.INITIALIZING

LEGAL: Mapping[LifecycleState, frozenset[LifecycleState]] = {
    S.READY: frozenset({S.DRAINING, S.STOPPED, S.ERROR}),
    S.DRAINING: frozenset({S.STOPPED, S.READY, S.ERROR}),
    S.STOPPED: frozenset({S.INITIALIZING, S.ERROR}),
    S.INITIALIZING: frozenset({S.READY, S.ERROR}),
    S.ERROR: frozenset({S.INITIALIZING}),
}


class IllegalTransition(ValueError):
    """A lifecycle step that the table does not allow; nothing was changed."""

    def __init__(self, current: LifecycleState, target: LifecycleState, reason: str) -> None:
        allowed = ", ".join(sorted(s.value for s in LEGAL[current])) or "nothing"
        super().__init__(
            f"illegal lifecycle transition {current.value} -> {target.value} ({reason!r}); "
            f"from {current.value} only {allowed} is allowed"
        )
        self.current = current
        self.target = target


@dataclass(frozen=True)
class Transition:
    source: LifecycleState
    target: LifecycleState
    at: float
    reason: str


def is_legal(current: LifecycleState, target: LifecycleState) -> bool:
    return target in LEGAL[current]


def transition(current: LifecycleState, target: LifecycleState, now: float, reason: str) -> Transition:
    """Validate one step; return the record to store (with its reason), or raise IllegalTransition."""
    current = LifecycleState(current)
    target = LifecycleState(target)
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a lifecycle transition needs a reason (it goes to the audit log)")
    if not is_legal(current, target):
        raise IllegalTransition(current, target, reason)
    return Transition(source=current, target=target, at=now, reason=reason.strip())


class StoredState(Protocol):
    """What the gates need of a stored lifecycle row (store.rows.LifecycleRow)."""

    @property
    def state(self) -> LifecycleState: ...

    @property
    def owned(self) -> bool: ...


def gate_states(rows: Mapping[str, StoredState], names: Iterable[str],
                held: Container[str] = frozenset()) -> dict[str, LifecycleState]:
    """The states `may_start` / `may_drain` judge from, for the backends `names`.

    A backend waiting since start-up to answer for the first time is INITIALIZING but is not being
    restarted by us: it must not hold its host's mutex (nor its own restart), so it is left out here.
    It is not READY either, so it never counts toward min_ready. A backend an operator holds (`held`:
    drained, retired) serves nothing: left out too, unless a restart of ours holds it (its mutex).
    """
    out: dict[str, LifecycleState] = {}
    for name in names:
        r = rows.get(name)
        st = r.state if r is not None else UNSEEN
        if st == S.INITIALIZING and not (r is not None and r.owned):
            continue
        if name in held and st not in OUT_OF_SERVICE:
            continue
        out[name] = st
    return out


def warmup_expired(entered_initializing_at: float, now: float, warmup_timeout: float) -> bool:
    """INITIALIZING for longer than warmup_timeout: time for INITIALIZING -> ERROR."""
    return now - entered_initializing_at >= warmup_timeout


def _host_of(backend: str, hosts: Mapping[str, str]) -> str:
    return hosts.get(backend, "") or ""


def may_start(
    backend: str,
    host: str,
    states_by_backend: Mapping[str, LifecycleState],
    hosts: Mapping[str, str],
) -> tuple[bool, str]:
    """Per-host mutex: at most one backend per host is DRAINING, STOPPED or INITIALIZING at a time.

    `host` is this backend's host ("" = unknown: then it shares a host with nobody). `hosts` maps every
    other backend to its host. A backend that is itself already restarting may not start again.
    """
    own = states_by_backend.get(backend)
    if own in OUT_OF_SERVICE:
        return False, f"{backend} is already {own.value}"
    if not host:
        return True, f"{backend} has no host: no per-host limit"
    for other, state in sorted(states_by_backend.items()):
        if other == backend or state not in OUT_OF_SERVICE:
            continue
        if _host_of(other, hosts) == host:
            return False, f"{other} on the same host {host} is {state.value}"
    return True, f"no other backend on host {host} is restarting"


def may_drain(
    backend: str,
    states_by_backend: Mapping[str, LifecycleState],
    min_ready: int,
    self_down: bool = False,
) -> tuple[bool, str]:
    """Fleet floor: never take a serving backend out unless at least min_ready OTHER backends are READY.

    A backend that is itself down serves nothing, so restarting it cannot lower capacity: always allowed.
    """
    if self_down:
        return True, f"{backend} is down: restarting it costs no capacity"
    ready_others = sum(1 for name, st in states_by_backend.items() if name != backend and st == S.READY)
    if ready_others < min_ready:
        return False, f"only {ready_others} other backend(s) READY, min_ready is {min_ready}"
    return True, f"{ready_others} other backend(s) READY (min_ready {min_ready})"


def may_restart(
    backend: str,
    states_by_backend: Mapping[str, LifecycleState],
    hosts: Mapping[str, str],
    min_ready: int,
    self_down: bool = False,
) -> tuple[bool, str]:
    """Both gates, host mutex first; the reason says which one refused."""
    ok, why = may_start(backend, _host_of(backend, hosts), states_by_backend, hosts)
    if not ok:
        return False, why
    return may_drain(backend, states_by_backend, min_ready, self_down)
