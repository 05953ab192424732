"""The remediator's /metrics: a prometheus_client collector over the SQLite state, plus the standard
process series (process_*, python_*) of the worker that answers the scrape.

Every worker reads the same state file, so all workers expose the same llm_health_remediator_*
values; the process series describe the worker that answered. Series names are a contract
(dashboards, rules, tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from llm_health.buildinfo import BuildInfoCollector
from llm_health.config import Config
from llm_health.remediator import lease
from llm_health.remediator.backend_io import VERIFY, WARMUP
from llm_health.remediator.lifecycle import UNSEEN, LifecycleState
from llm_health.remediator.store import AdminState, IncidentState, MemberStep, RolloutState, StateStore


class StateCollector(Collector):
    def __init__(self, config: Config, store: StateStore, health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.config = config
        self.store = store
        self.health = health

    def collect(self) -> Iterator[Metric]:
        store, config = self.store, self.config
        names = [b.name for b in config.backends]

        received = store.counters("alerts_received")
        m = CounterMetricFamily("llm_health_remediator_alerts_received", "Alerts received in webhook notifications.",
                                labels=["status"])
        for st in ("firing", "resolved"):
            m.add_metric([st], received.get(st, 0))
        yield m

        m = CounterMetricFamily("llm_health_remediator_decisions", "Decisions recorded in the audit log, by kind.",
                                labels=["decision"])
        for kind, n in sorted(store.counters("decisions").items()):
            m.add_metric([kind], n)
        yield m

        restarts = store.restart_counts()
        for label, n in store.counters("restarts_pruned").items():   # history pruned by retention still counts
            backend, _, result = label.partition("\t")
            if result and result != "dry_run":
                restarts[(backend, result)] = restarts.get((backend, result), 0) + n
        m = CounterMetricFamily("llm_health_remediator_restarts", "Restart actions, by backend and result.",
                                labels=["backend", "result"])
        for (backend, result), n in sorted(restarts.items()):
            m.add_metric([backend, result], n)
        yield m

        g = GaugeMetricFamily("llm_health_remediator_breaker_open", "1 while the fleet circuit breaker is open.")
        g.add_metric([], int(store.breaker().open))
        yield g

        rows = store.lifecycles()
        state = GaugeMetricFamily("llm_health_remediator_lifecycle_state",
                                  "1 for the lifecycle state each backend is in, 0 for the others.",
                                  labels=["backend", "state"])
        since = GaugeMetricFamily("llm_health_remediator_lifecycle_since_timestamp_seconds",
                                  "Unix time of the backend's last lifecycle transition (0 = not looked at yet).",
                                  labels=["backend"])
        for name in names:
            r = rows.get(name)
            current = r.state if r else UNSEEN
            for st in LifecycleState:
                state.add_metric([name, st.value], int(st == current))
            since.add_metric([name], r.since if r else 0.0)
        yield state
        yield since

        held = store.admins()
        admin = GaugeMetricFamily("llm_health_remediator_admin_state",
                                  "1 for the operator state each backend is in (in_service, drained, retired: "
                                  "llm-health ctl), 0 for the others.", labels=["backend", "state"])
        for name in names:
            current_admin = held[name].state if name in held else AdminState.IN_SERVICE
            for ast in AdminState:
                admin.add_metric([name, ast.value], int(ast == current_admin))
        yield admin

        waiting = [i for i in store.active_incidents() if i.state == IncidentState.NEEDS_ACK]
        acks = {i.backend for i in waiting}
        yield flags("llm_health_remediator_needs_ack",
                    "1 while the backend's incident waits for a person (outcome unknown, never retried blindly): "
                    "acknowledge through POST /api/backends/<name>/ack.", names, acks)
        held_room = {i.backend for i in waiting if i.last_decision == "no_headroom"}
        yield flags("llm_health_remediator_host_needs_attention",
                    "1 while the backend waits for a person because its old process did not go away: the headroom "
                    "check never passed after the stop, nothing was started.", names, held_room)

        yield from rollout_metrics(store)

        esc = store.counters("escalations")
        m = CounterMetricFamily("llm_health_remediator_escalations",
                                "Restarts that need a person (warm-up timeout, action timeout, never ready).",
                                labels=["backend"])
        for name in names:
            m.add_metric([name], esc.get(name, 0))
        yield m

        sil = store.counters("silences")
        m = CounterMetricFamily("llm_health_remediator_silences",
                                "Alertmanager silences around restarts, by result.", labels=["result"])
        for result in ("created", "create_failed", "expired", "expire_failed"):
            m.add_metric([result], sil.get(result, 0))
        yield m

        probes = {tuple(k.split("\t", 1)): v for k, v in store.counters("probes").items() if "\t" in k}
        keys = {(name, purpose) for name in names for purpose in (VERIFY, WARMUP)} | set(probes)
        m = CounterMetricFamily("llm_health_remediator_probes",
                                "Generation requests the remediator sent (idle probes of its verifications, "
                                "one-token warm-up requests), by backend and purpose.", labels=["backend", "purpose"])
        for name, purpose in sorted(keys):
            m.add_metric([name, purpose], probes.get((name, purpose), 0))
        yield m

        yield from lease_metrics(store)

        last = store.last_heard()
        g = GaugeMetricFamily("llm_health_remediator_last_webhook_timestamp_seconds",
                              "Unix time of the last notification accepted from Alertmanager (0: none yet in "
                              "this state file).")
        g.add_metric([], last.webhook_at or 0.0)
        yield g
        g = GaugeMetricFamily("llm_health_remediator_last_watchdog_timestamp_seconds",
                              "Unix time of the last firing Watchdog (Watchdog, LLMHealthWatchdog) received from "
                              "Alertmanager (0: none yet): the remediator's own dead man's switch.")
        g.add_metric([], last.watchdog_at or 0.0)
        yield g

        if self.health is not None:
            report = self.health()
            g = GaugeMetricFamily("llm_health_remediator_healthy",
                                  "1 when this worker's /healthz checks pass (state file, writes, integrity, "
                                  "authority loop).")
            g.add_metric([], int(bool(report.get("ok"))))
            yield g
            if "oldest_look_seconds" in report:
                g = GaugeMetricFamily("llm_health_remediator_oldest_look_seconds",
                                      "How long this worker's longest-running look at one backend has run (0: none).")
                g.add_metric([], float(report["oldest_look_seconds"]))
                yield g
                g = GaugeMetricFamily("llm_health_remediator_stuck_looks",
                                      "Looks running longer than any look can take with these settings (/healthz "
                                      "fails while > 0).")
                g.add_metric([], float(report.get("stuck_looks", 0)))
                yield g


def lease_metrics(store: StateStore) -> Iterator[Metric]:
    """Who leads, as the state says (every instance on one state reports the same; instances that report
    different holders are not sharing one state: LLMHealthRemediatorSplitAuthority)."""
    seen = lease.observed(store)
    holder = GaugeMetricFamily("llm_health_remediator_lease_holder_info",
                               "1 for the instance that holds the restart authority's lease, as the state says.",
                               labels=["holder"])
    epoch = GaugeMetricFamily("llm_health_remediator_lease_epoch",
                              "The lease's term (fencing token): every takeover increments it.")
    left = GaugeMetricFamily("llm_health_remediator_lease_seconds_left",
                             "Seconds the lease has left on its clock (the database's on PostgreSQL, the holder's "
                             "monotonic clock on SQLite; NaN: another boot's clock); below 0: no leader.")
    if seen is not None:
        holder.add_metric([seen.holder], 1)
        epoch.add_metric([], seen.epoch)
        left.add_metric([], float("nan") if seen.seconds_left is None else seen.seconds_left)
    yield holder
    yield epoch
    yield left


def rollout_metrics(store: StateStore) -> Iterator[Metric]:
    """The latest rollout (remediator/rollout/): its state and its members' steps; finished ones by result."""
    latest = store.rollouts(limit=1)
    state = GaugeMetricFamily("llm_health_remediator_rollout_state",
                              "1 for the state the latest rollout is in (running, paused, rolling_back, succeeded, "
                              "rolled_back, failed), 0 for the others.", labels=["rollout", "state"])
    steps = GaugeMetricFamily("llm_health_remediator_rollout_members",
                              "Members of the latest rollout, by step.", labels=["rollout", "step"])
    soaking = GaugeMetricFamily("llm_health_remediator_rollout_canary_soaking",
                                "1 while the backend is a rollout's canary in its soak (the gate watches it).",
                                labels=["backend"])
    if latest:
        r = latest[0]
        for st in RolloutState:
            state.add_metric([str(r.id), st.value], int(st == r.state))
        members = store.rollout_members(r.id)
        for step in MemberStep:
            steps.add_metric([str(r.id), step.value], sum(1 for m in members if m.step == step))
        for m in members:
            if m.step == MemberStep.SOAKING and r.active:
                soaking.add_metric([m.backend], 1)
    yield state
    yield steps
    yield soaking
    ended = store.rollout_counts()
    m = CounterMetricFamily("llm_health_remediator_rollouts", "Rollouts that ended, by result.", labels=["result"])
    ended[RolloutState.FAILED] = ended.get(RolloutState.FAILED, 0) + ended.get(RolloutState.ACKNOWLEDGED, 0)
    for st in (RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.FAILED):
        m.add_metric([st.value], ended.get(st, 0))       # an acknowledged one failed: the count never drops
    yield m


def registry_for(config: Config, store: StateStore, health: Callable[[], dict[str, Any]] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(config, store, health))
    registry.register(BuildInfoCollector())
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text format (tests and tools; /metrics answers through llm_health/exposition.py)."""
    return generate_latest(registry)


def flags(name: str, documentation: str, backends: list[str], on: set[str]) -> GaugeMetricFamily:
    """A 0/1 gauge per backend: 1 for those in `on`."""
    g = GaugeMetricFamily(name, documentation, labels=["backend"])
    for backend in backends:
        g.add_metric([backend], int(backend in on))
    return g
