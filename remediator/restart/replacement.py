"""Step `warm-up` of a pod that comes back under a new name: the incident follows the workload slot.

A Deployment's pod (owned by a ReplicaSet: discovery's `__meta_kubernetes_pod_controller_*` labels,
Backend.workload) that a restart deleted is replaced by a new pod with a new name; the old name never
answers again. The claim recorded the workload and its members at that moment (act.py); here the first
backend of the same workload that was not a member is the replacement: it is taken (never by two
incidents), must pass the same warm-up gate as any restarted backend, and then closes the incident.
The old pod's lifecycle is released (no incident owns it: it leaves the fleet when discovery drops it).
Without a replacement by `warmup_timeout`, the warm-up times out as any other (needs a person).

A StatefulSet pod (and a LeaderWorkerSet leader) comes back under its own name: warmup.py as usual.
"""

from __future__ import annotations

from llm_health.config import Backend
from llm_health.remediator.restart.choices import Warmup, warmup_after_check
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.result import DONE, LookAgain, StepResult
from llm_health.remediator.restart.silences import unsilence_fenced
from llm_health.remediator.restart.warmup import check, settle, warmup_timed_out
from llm_health.remediator.store import Incident, IncidentState

IS = IncidentState


def candidates(inc: Incident, fleet: list[Backend]) -> list[Backend]:
    """Backends of the incident's workload that were not there when its restart began, by name. Pure."""
    was = set(inc.members) | {inc.backend}
    return sorted((b for b in fleet if b.workload == inc.workload and b.name not in was), key=lambda b: b.name)


def follow(ctx: Context, inc: Incident) -> Backend | None:
    """The replacement the incident follows: the one it took, else the first untaken candidate (taken now)."""
    if inc.replacement:
        return ctx.config.backend(inc.replacement)
    now = ctx.clocks.wall()
    for b in candidates(inc, list(ctx.config.backends)):
        with ctx.fenced() as tx:
            if tx.incident_in(inc.id, IS.WARMING) is None:
                return None
            if tx.take_replacement(inc.id, b.name):
                tx.event(now, "replacement", inc.backend, inc.id,
                         reason=f"{b.name} is the new pod of {inc.workload} that replaces {inc.backend}; "
                         "the incident follows it through the warm-up gate", replacement=b.name)
                return b
    return None


def watch_replacement(ctx: Context, inc: Incident) -> StepResult:
    deadline = float(inc.warm_deadline or 0)
    if ctx.clocks.mono() > deadline:
        return warmup_timed_out(ctx, inc.id, inc.backend, f"no new pod of {inc.workload} passed the warm-up gate")
    target = follow(ctx, inc)
    if target is None:
        t = ctx.clocks.mono()
        with ctx.fenced() as tx:
            if tx.incident_in(inc.id, IS.WARMING) is None:
                return DONE
            tx.look_again_at(inc.id, t + ctx.r.warmup_poll,
                             note=f"waiting for the new pod of {inc.workload} that replaces {inc.backend}")
        return LookAgain(t + ctx.r.warmup_poll)
    ready, why = check(ctx, target)
    if warmup_after_check(ready, ctx.clocks.mono(), deadline) == Warmup.TIMED_OUT:
        return warmup_timed_out(ctx, inc.id, inc.backend, f"{target.name}: {why}")
    why = f"{target.name} (replaces {inc.backend}): {why}"
    result = settle(ctx, inc.id, IS.WARMING, target, ready, why, note=why[:200])
    if ready:
        release(ctx, inc, target.name)
    return result


def release(ctx: Context, inc: Incident, replacement: str) -> None:
    """The old pod is gone: its alerts back, its lifecycle owned by no incident (it holds no restart)."""
    unsilence_fenced(ctx, inc.backend)
    now = ctx.clocks.wall()
    with ctx.fenced() as tx:
        row = tx.lifecycle(inc.backend)
        if row is not None and row.incident_id == inc.id:
            tx.set_lifecycle_owner(inc.backend, None)
            tx.event(now, "replaced", inc.backend, inc.id, reason=f"replaced by {replacement} "
                     f"of {inc.workload}; it leaves the fleet when discovery drops it")
