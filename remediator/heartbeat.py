"""The remediator as its own dead man's switch: when did Alertmanager last reach us?

Every notification accepted at POST /webhook stamps `Heard.WEBHOOK`; one with a firing Watchdog (the
always-firing alert of kube-prometheus and prometheus-operator, `Watchdog`, or ours, `LLMHealthWatchdog`
from `llm-health rules render --watchdog`) also stamps `Heard.WATCHDOG`, in the transaction that records
it. Both are in the state file, so every gunicorn worker exports the same times
(llm_health_remediator_last_webhook_timestamp_seconds, ..._last_watchdog_timestamp_seconds) and a restart
of the remediator forgets neither; the alert
LLMHealthRemediatorNotHearingAlertmanager fires when the Watchdog stops arriving.

A notification of Watchdogs only (the example route sends the Watchdog to us every few minutes, grouped by
alertname) is counted in alerts_received and stamped, and nothing else: it concerns no backend, so it
opens nothing and adds no audit event (which would otherwise gain two lines per delivery, forever).
"""

from __future__ import annotations

from typing import Any

from llm_health.remediator.alert import Alert, Notification
from llm_health.remediator.store import Heard, Transaction

WATCHDOG_ALERTS = frozenset({"Watchdog", "LLMHealthWatchdog"})


def is_watchdog(alert: Alert) -> bool:
    return alert.name in WATCHDOG_ALERTS and not alert.wants_restart


def only_watchdogs(n: Notification) -> bool:
    return bool(n.alerts) and all(is_watchdog(a) for a in n.alerts)


def stamp(tx: Transaction, n: Notification, now: float) -> None:
    """When Alertmanager reached us, inside the transaction that records the notification
    (incident.record, watchdogs_only)."""
    tx.heard(Heard.WEBHOOK, now)
    if any(is_watchdog(a) and a.status == "firing" for a in n.alerts):
        tx.heard(Heard.WATCHDOG, now)


def watchdogs_only(tx: Transaction, n: Notification, now: float) -> dict[str, Any]:
    """A notification of Watchdogs only: counted and stamped, in the write transaction `tx`; the webhook's
    answer."""
    for a in n.alerts:
        tx.bump("alerts_received", a.status)
    stamp(tx, n, now)
    return {"deduplicated": False, "alerts": len(n.alerts), "watchdog": True}
