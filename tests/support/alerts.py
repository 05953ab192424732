"""Shared helpers for the remediator tests (payloads like Alertmanager 0.25 sends them)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(labels.items())).encode()).hexdigest()[:16]


def alert(
    backend: str | None = "gpu-a",
    alertname: str = "LLMBackendStalled",
    status: str = "firing",
    starts_at: str = "2026-11-30T00:00:00Z",
    restart: bool = True,
    **labels: str,
) -> dict[str, Any]:
    lbl = {"alertname": alertname, "severity": "critical", **labels}
    if backend is not None:
        lbl["backend"] = backend
    if restart:
        lbl["remediation"] = "restart"
    return {
        "status": status,
        "labels": lbl,
        "annotations": {"summary": f"{alertname} on {backend}"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T00:05:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint(lbl),
    }


def payload(*alerts: dict[str, Any], external: str = "http://am-0:9093", **extra: Any) -> dict[str, Any]:
    alerts = alerts or (alert(),)
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    names = sorted({a["labels"]["alertname"] for a in alerts})
    return {
        "receiver": "llm-health",
        "status": status,
        "alerts": list(alerts),
        "groupLabels": {"alertname": names[0]},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": external,
        "version": "4",
        "groupKey": '{}:{alertname="' + names[0] + '"}',
        "truncatedAlerts": 0,
        **extra,
    }


def one_pass(authority: Any) -> None:
    """One pass over everything due, through the production path: what the scheduler's resync and workers do,
    in this thread (Authority.due_keys, then Authority.work for each key)."""
    for key in authority.due_keys():
        authority.work(key)
