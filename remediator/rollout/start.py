"""Start a rollout: validate what was asked (ctl, the API, a YAML plan) and record it with its members.

Bad input is refused with a clear error and nothing changes (`RequestError`, HTTP 400). A rollout that
cannot run here is refused too, in the transaction that would record it (`refuse`, HTTP 409): another
rollout is active, the breaker is open, a dry run (a rollout changes commands), no Prometheus for the gate,
a member without a restart action or held by an operator, or a fleet too small to take one out above
min_ready. The new command's placeholders are filled from the configuration only (never from an alert
or a discovery label): {backend}, {host}, {url}, {model}.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_health.config import Backend, Config
from llm_health.remediator import lifecycle
from llm_health.remediator.rollout.gate import Bounds, BoundsError
from llm_health.remediator.rollout.kinds import Kind
from llm_health.remediator.rollout.plan import Candidate, order
from llm_health.remediator.rollout.queries import prometheus_url
from llm_health.remediator.sequence import has_restart
from llm_health.remediator.store import (
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
    StateStore,
    Transaction,
)

PLACEHOLDERS = ("backend", "host", "url", "model")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_ARGV = 64
MAX_ARG = 4096
MAX_TEXT = 500
MAX_SOAK = 7 * 86400.0


class RequestError(ValueError):
    """What was asked is not a rollout (HTTP 400); nothing changed."""


class Refusal(enum.StrEnum):
    ACTIVE = "rollout_active"        # another rollout is running, paused or rolling back
    BREAKER = "breaker_open"
    DRY_RUN = "dry_run"
    NO_PROMETHEUS = "no_prometheus"
    MEMBER = "member"                # a member cannot take part (no restart, held, unknown)
    FLOOR = "min_ready"              # the fleet is too small to take one out
    UNACKNOWLEDGED = "failed_unacknowledged"   # the latest rollout failed its rollback: a person first


@dataclass(frozen=True)
class RolloutRequest:
    argv: tuple[str, ...]
    by: str
    reason: str
    canary: int
    per_host: int
    soak: float
    bounds: Bounds
    backends: tuple[str, ...] = ()   # empty: every configured backend with a restart action, in service


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
        raise RequestError(f"{key} must be a non-empty string (at most {MAX_TEXT} characters): it goes to the audit log")
    return value.strip()


def _whole(data: Mapping[str, Any], key: str, default: int, low: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"{key} must be a whole number >= {low}")
    return value


def parse_request(data: Any, config: Config) -> RolloutRequest:
    """A rollout from a JSON/YAML mapping: {command: [argv], by, reason, canary?, per_host?, soak?,
    backends?, gate?: {...}, pass_without_traffic?}; defaults from remediator.rollout."""
    if not isinstance(data, Mapping):
        raise RequestError("expected a JSON object {command, by, reason, ...}")
    known = {"command", "by", "reason", "canary", "per_host", "soak", "backends", "gate", "pass_without_traffic"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RequestError(f"unknown field(s): {', '.join(unknown)}")
    argv = data.get("command")
    if (not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV
            or not all(isinstance(a, str) and a and len(a) <= MAX_ARG and "\0" not in a for a in argv)):
        raise RequestError(f"command must be a non-empty list of at most {MAX_ARGV} non-empty strings (an argv: no "
                           "shell ever sees it)")
    for arg in argv:
        for name in _PLACEHOLDER.findall(arg):
            if name not in PLACEHOLDERS:
                raise RequestError(f"command: unknown placeholder {{{name}}}; known: "
                                   + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
    ro = config.remediator.rollout
    soak = data.get("soak", ro.soak)
    if isinstance(soak, bool) or not isinstance(soak, int | float) or not math.isfinite(soak) or not 0 < soak <= MAX_SOAK:
        raise RequestError(f"soak must be a number of seconds in (0, {MAX_SOAK:g}]")
    per_host = _whole(data, "per_host", 1, 1)
    if per_host != 1:
        raise RequestError("per_host: only 1 is supported (the authority's per-host mutex restarts one backend of a "
                           "host at a time)")
    backends = data.get("backends", [])
    if not isinstance(backends, list) or not all(isinstance(b, str) and b for b in backends):
        raise RequestError("backends must be a list of backend names")
    if len(set(backends)) != len(backends):
        raise RequestError("backends: a name appears twice")
    gate = data.get("gate", {})
    if not isinstance(gate, Mapping):
        raise RequestError("gate must be a mapping of gate settings")
    base = {"interval": ro.gate_interval, "ttft_p95_ratio": ro.ttft_p95_ratio, "e2e_p95_ratio": ro.e2e_p95_ratio,
            "latency_slack": ro.latency_slack, "error_ratio_delta": ro.error_ratio_delta,
            "min_requests": ro.min_requests, "max_query_errors": ro.max_query_errors,
            "max_inconclusive": ro.max_inconclusive}
    pass_without = data.get("pass_without_traffic", False)
    if not isinstance(pass_without, bool):
        raise RequestError("pass_without_traffic must be true or false")
    try:
        bounds = Bounds.from_dict({**base, **gate, **({"pass_without_traffic": True} if pass_without else {})})
    except BoundsError as exc:
        raise RequestError(str(exc)) from exc
    return RolloutRequest(argv=tuple(argv), by=_text(data, "by"), reason=_text(data, "reason"),
                          canary=_whole(data, "canary", ro.canary, 1), per_host=per_host, soak=float(soak),
                          bounds=bounds, backends=tuple(backends))


def values_of(backend: Backend) -> dict[str, str]:
    return {"backend": backend.name, "host": backend.host, "url": backend.url, "model": backend.model}


def fill(argv: Sequence[str], backend: Backend) -> tuple[str, ...]:
    """The command for one backend: placeholders from its configuration."""
    values = values_of(backend)
    return tuple(_PLACEHOLDER.sub(lambda m: values[m.group(1)], a) for a in argv)


@dataclass(frozen=True)
class Started:
    rollout_id: int | None
    refusal: Refusal | None = None
    reason: str = ""


def start(store: StateStore, config: Config, req: RolloutRequest, now: float) -> Started:
    with store.tx() as tx:
        refusal, why, chosen = check(tx, config, req)
        if refusal is not None:
            tx.event(now, Kind.REFUSED, "", reason=f"rollout refused ({refusal.value}): {why}; asked by {req.by}: "
                     f"{req.reason}", refusal=refusal.value, by=req.by)
            return Started(None, refusal, why)
        commands = tx.commands()
        ordered = order([Candidate(b.name, b.host) for b in chosen], req.canary)
        by_name = {b.name: b for b in chosen}
        members = []
        for position, (c, canary) in enumerate(ordered):
            b = by_name[c.backend]
            row = commands.get(b.name)
            members.append(RolloutMember(rollout_id=0, backend=b.name, host=b.host, position=position, canary=canary,
                                         step=MemberStep.PENDING, argv=fill(req.argv, b),
                                         previous=row.argv if row is not None else None))
        rollout = Rollout(id=0, state=RolloutState.RUNNING, argv=req.argv, canary=req.canary, per_host=req.per_host,
                          soak=req.soak, gate=req.bounds.as_dict(), by=req.by, reason=req.reason, created_at=now,
                          updated_at=now, note="starting")
        rollout_id = tx.add_rollout(rollout, members)
        canaries = [m.backend for m in members if m.canary]
        tx.event(now, Kind.STARTED, "", reason=f"rollout {rollout_id} of {len(members)} backend(s) started by "
                 f"{req.by}: {req.reason}; canary {', '.join(canaries)}, soak {req.soak:g}s; new command "
                 f"{' '.join(req.argv)[:300]}", rollout_id=rollout_id, by=req.by, members=[m.backend for m in members],
                 gate=req.bounds.as_dict())
        return Started(rollout_id, None, f"rollout {rollout_id} started")


def check(tx: Transaction, config: Config, req: RolloutRequest) -> tuple[Refusal | None, str, list[Backend]]:
    r = config.remediator
    active = tx.active_rollouts()
    if active:
        return Refusal.ACTIVE, f"rollout {active[0].id} is {active[0].state.value}: one rollout at a time", []
    latest = tx.rollouts(limit=1)
    if latest and latest[0].state == RolloutState.FAILED:
        return Refusal.UNACKNOWLEDGED, (f"rollout {latest[0].id} failed its rollback ({latest[0].note}): repair it, "
                                        f"then `llm-health ctl rollout ack {latest[0].id}`"), []
    if r.dry_run:
        return Refusal.DRY_RUN, "a dry run changes nothing, and a rollout changes commands", []
    br = tx.breaker()
    if br.open:
        return Refusal.BREAKER, f"the breaker is open ({br.reason}): reset it first", []
    if not prometheus_url(config):
        return Refusal.NO_PROMETHEUS, ("the canary's gate reads Prometheus: set remediator.rollout.prometheus_url "
                                       "(or discovery.prometheus_url)"), []
    held = tx.admins()
    if req.backends:
        chosen = []
        for name in req.backends:
            b = config.backend(name)
            if b is None:
                return Refusal.MEMBER, f"unknown backend {name[:80]!r}", []
            if not has_restart(b):
                return Refusal.MEMBER, f"{name} has no restart action configured", []
            if name in held:
                return Refusal.MEMBER, f"{name} is {held[name].state.value} by {held[name].by}: put it back first", []
            chosen.append(b)
    else:
        chosen = [b for b in config.backends if has_restart(b) and b.name not in held]
    pods = [b.name for b in chosen if b.workload]
    if pods:
        return Refusal.MEMBER, (f"{', '.join(pods[:5])} belong(s) to a workload that replaces its pods under new "
                                "names: roll the Deployment itself (maxSurge 0, maxUnavailable 1) and let the "
                                "readiness endpoint gate it"), []
    if not chosen:
        return Refusal.MEMBER, "no backend in service has a restart action", []
    used = {name for arg in req.argv for name in _PLACEHOLDER.findall(arg)}
    for b in chosen:
        empty = sorted(name for name, value in values_of(b).items() if name in used and not value)
        if empty:
            return Refusal.MEMBER, (f"the command uses {', '.join('{' + n + '}' for n in empty)}, which {b.name} "
                                    "has no value for (not configured)"), []
    if req.canary > len(chosen):
        return Refusal.MEMBER, f"{req.canary} canaries asked for, {len(chosen)} member(s)", []
    states = lifecycle.gate_states(tx.lifecycles(), [b.name for b in config.backends], held)
    ready = sum(1 for st in states.values() if st == lifecycle.LifecycleState.READY)
    if ready - 1 < r.min_ready:
        return Refusal.FLOOR, (f"{ready} backend(s) READY and min_ready is {r.min_ready}: no member could be taken "
                               "out (no surge: the fleet is a fixed pool)"), []
    return None, "", chosen
