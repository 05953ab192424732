"""The remediator's side of discovery: backends from Prometheus' targets join the configured ones.

`attach` builds one Discovery per gunicorn worker (each worker reads Prometheus on its own; they
agree within one refresh interval) and returns the config whose `backends` is the live list, so the
webhook, the authority, the API and the agent check all resolve a backend by name against static +
discovered backends without knowing where it came from. It queries nothing and starts nothing: the
worker's services do (services.py: one refresh before the first request, then the refresher thread).

* A discovered backend with an open incident is never removed, even past the grace period: a
  restart in progress (a pod being recreated leaves the target list for a while) must be finished
  and accounted for, not dropped.
* Every refused target and every refused restart is an audit event `discovery_refused` (once a day
  per backend and reason): the backend is still watched, it is just never restarted.
* A backend name claimed by two or more targets is an audit event `discovery_duplicate` (once a day
  per name and set of claimants), worded like an escalation: neither is restarted until a person
  removes the impostor (or renames one of two real servers); `LLMHealthDiscoveryDuplicateNames` fires.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from llm_health.config import Backend, Config
from llm_health.discovery import Discovery, LiveBackends, Refusal, RefusalKind
from llm_health.remediator.store import StateStore

log = logging.getLogger("llm_health.remediator")

AUDIT_EVERY = 86400.0       # a refusal that persists is audited again after this long
EVENT = "discovery_refused"
DUPLICATE_EVENT = "discovery_duplicate"


def audit_refusals(store: StateStore, refusals: tuple[Refusal, ...], now: float) -> int:
    """One audit event per refusal (one per name for duplicates) not already recorded in the last
    AUDIT_EVERY seconds; returns how many."""
    written = 0
    if not refusals:
        return 0
    claimed: dict[str, list[str]] = {}
    with store.tx() as tx:
        for r in refusals:
            if r.kind == RefusalKind.DUPLICATE:
                claimed.setdefault(r.backend, []).append(r.target)
                continue
            reason = (f"{r.reason}; watched, never restarted by us" if r.restart_only
                      else f"target {r.target} not used: {r.reason}")
            if tx.event_unless_recent(now, EVENT, r.backend, reason, AUDIT_EVERY, target=r.target,
                                      restart_only=r.restart_only, refusal=str(r.kind)):
                written += 1
        for name, targets in sorted(claimed.items()):
            targets = sorted(targets)
            reason = (f"backend name {name} is claimed by {len(targets)} discovery targets ({', '.join(targets)}): "
                      "none of them is restarted while this lasts; needs a person: remove the target that is not "
                      "yours (a PodMonitor/ServiceMonitor copying the name), or give two real servers two names")
            if tx.event_unless_recent(now, DUPLICATE_EVENT, name, reason, AUDIT_EVERY, targets=targets):
                written += 1
    return written


def attach(config: Config, store: StateStore, clock: Callable[[], float] = time.time) -> tuple[Config, Discovery | None]:
    """With discovery configured: a Discovery (not refreshed, not started) and the config reading the live
    fleet. Without it: the config unchanged and None."""
    if not config.discovery.enabled:
        return config, None
    def keep(name: str) -> bool:
        return store.active_incident(name) is not None

    discovery = Discovery(config.discovery, static=tuple(config.backends), keep=keep,
                          reserved=[p.name for p in config.proxies])
    last: list[tuple[tuple[Refusal, ...], float]] = []    # what was audited last, and when

    def audit(_backends: tuple[Backend, ...], refusals: tuple[Refusal, ...]) -> None:
        now = clock()
        if last and last[0][0] == refusals and now - last[0][1] < AUDIT_EVERY / 2:
            return      # same as last time: no write transaction on every refresh
        audit_refusals(store, refusals, now)
        last[:] = [(refusals, now)]

    discovery.on_change(audit)
    live = LiveBackends(config.backends, discovery)
    return dataclasses.replace(config, backends=live), discovery
