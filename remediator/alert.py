"""Validate an Alertmanager webhook payload (version "4") into `Alert` values.

Nothing in a payload is trusted further than this module: labels are plain strings kept as data,
never formatted into a command line. Unknown keys are ignored (newer Alertmanagers add fields).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

MAX_ALERTS = 1000
MAX_LABEL_CHARS = 1024
STATUSES = ("firing", "resolved")


class PayloadError(ValueError):
    """The body is not a usable Alertmanager webhook payload; the message says why."""


@dataclass(frozen=True)
class Alert:
    status: str                      # firing | resolved
    labels: dict[str, str]
    fingerprint: str
    starts_at: str
    ends_at: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def wants_restart(self) -> bool:
        return self.labels.get("remediation") == "restart"


@dataclass(frozen=True)
class Notification:
    receiver: str
    status: str
    group_key: str
    alerts: tuple[Alert, ...]
    sender: str = ""          # externalURL of the Alertmanager that sent it: audit only, never a key

    def dedup_key(self) -> str:
        """Identical for HA copies and resends of one notification; never uses externalURL."""
        parts = sorted((a.fingerprint, a.starts_at, a.ends_at, a.status) for a in self.alerts)
        raw = json.dumps([self.group_key, self.status, parts], separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()


def _str(value: Any, where: str, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise PayloadError(f"{where} must be a string")
    if "\x00" in value:
        raise PayloadError(f"{where} contains a NUL character")
    return value


def _labels(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where} must be an object of string labels")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise PayloadError(f"{where} must map strings to strings")
        if len(k) > MAX_LABEL_CHARS or len(v) > MAX_LABEL_CHARS:
            raise PayloadError(f"{where}.{k[:40]} is longer than {MAX_LABEL_CHARS} characters")
        if "\x00" in k or "\x00" in v:      # no label has one (Prometheus), and PostgreSQL's text cannot hold it
            raise PayloadError(f"{where} has a NUL character in a label")
        out[k] = v
    return out


def _fingerprint(labels: dict[str, str]) -> str:
    raw = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def parse_alert(raw: Any, where: str) -> Alert:
    if not isinstance(raw, dict):
        raise PayloadError(f"{where} must be an object")
    status = _str(raw.get("status"), f"{where}.status")
    if status not in STATUSES:
        raise PayloadError(f"{where}.status must be firing or resolved, got {status[:20]!r}")
    labels = _labels(raw.get("labels"), f"{where}.labels")
    fingerprint = _str(raw.get("fingerprint"), f"{where}.fingerprint", default="") or _fingerprint(labels)
    return Alert(
        status=status,
        labels=labels,
        fingerprint=fingerprint[:64],
        starts_at=_str(raw.get("startsAt"), f"{where}.startsAt", default="")[:64],
        ends_at=_str(raw.get("endsAt"), f"{where}.endsAt", default="")[:64],
    )


def parse_notification(data: Any) -> Notification:
    if not isinstance(data, dict):
        raise PayloadError("payload must be a JSON object")
    version = data.get("version", "4")
    if version != "4":
        raise PayloadError(f"unsupported webhook payload version {str(version)[:10]!r} (expected \"4\")")
    alerts_raw = data.get("alerts")
    if not isinstance(alerts_raw, list):
        raise PayloadError("alerts must be a list")
    if len(alerts_raw) > MAX_ALERTS:
        raise PayloadError(f"too many alerts ({len(alerts_raw)} > {MAX_ALERTS})")
    alerts = tuple(parse_alert(a, f"alerts[{i}]") for i, a in enumerate(alerts_raw))
    status = _str(data.get("status"), "status", default="firing" if any(
        a.status == "firing" for a in alerts) else "resolved")
    if status not in STATUSES:
        raise PayloadError("status must be firing or resolved")
    return Notification(
        receiver=_str(data.get("receiver"), "receiver", default="")[:200],
        status=status,
        group_key=_str(data.get("groupKey"), "groupKey", default="")[:2000],
        alerts=alerts,
        sender=_str(data.get("externalURL"), "externalURL", default="")[:200],
    )
