"""Group labels: which cluster and namespace an alert, a backend and a remediator belong to.

The same backend name in two clusters (or two namespaces) is two backends. Prometheus' rules keep the
group labels in their aggregations (`llm-health rules render --group-labels cluster,namespace`; the
`cluster` label usually comes from Prometheus' `external_labels`, which it adds to every alert), so a
restart alert names its backend *and* its group. Two places say which group a remediator acts in:

* `remediator.group_labels: {cluster: eu-1}`: this remediator serves that group only. A restart alert
  must carry each of these labels with that value; another value, or no such label, and the alert is
  recorded and ignored (a shared Alertmanager may send every cluster's alerts to every remediator).
* a backend's `labels: {namespace: llm}` (static backends in the file; discovered ones take the target
  labels named in `discovery.group_labels`): an alert about the backend must carry the same values.

A missing label never matches: a restart is never chosen beyond what the operator allowed (principle 7).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

#: a group label set as stored and compared: sorted (name, value) pairs
Labels = tuple[tuple[str, str], ...]

LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: recorded with every incident when an alert carries them, whatever the settings (the audit shows them)
RECORDED = ("cluster", "namespace")
#: labels that name other things and can never be group labels
NOT_GROUP_LABELS = frozenset({"backend", "alertname", "remediation", "severity", "instance", "job"})
MAX_VALUE_CHARS = 253


class GroupLabelError(ValueError):
    """A group label setting is unusable; the message says where."""


def parse_labels(raw: Any, where: str) -> Labels:
    """A mapping of group label -> value from a config file, checked; sorted pairs."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise GroupLabelError(f"{where}: must be a mapping of label name -> value, e.g. {{namespace: llm}}")
    out: list[tuple[str, str]] = []
    for name, value in raw.items():
        if not isinstance(name, str) or not LABEL_RE.fullmatch(name):
            raise GroupLabelError(f"{where}: {name!r} is not a label name ({LABEL_RE.pattern})")
        if name in NOT_GROUP_LABELS:
            raise GroupLabelError(f"{where}: {name!r} names something else and cannot be a group label")
        if not isinstance(value, str) or not value or len(value) > MAX_VALUE_CHARS:
            raise GroupLabelError(f"{where}.{name}: must be a non-empty string of at most {MAX_VALUE_CHARS} "
                                  "characters")
        out.append((name, value))
    return tuple(sorted(out))


def parse_names(raw: Any, where: str) -> tuple[str, ...]:
    """A list of group label names from a config file, checked."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise GroupLabelError(f"{where}: must be a list of label names, e.g. [cluster, namespace]")
    for name in raw:
        if not LABEL_RE.fullmatch(name) or name.startswith("__"):
            raise GroupLabelError(f"{where}: {name!r} is not a target label name")
        if name in NOT_GROUP_LABELS:
            raise GroupLabelError(f"{where}: {name!r} names something else and cannot be a group label")
    return tuple(dict.fromkeys(raw))


def mismatch(alert_labels: Mapping[str, str], wanted: Labels, whose: str) -> str | None:
    """Why an alert with `alert_labels` is not about the group `wanted` (of `whose`), or None when it is."""
    for name, value in wanted:
        got = alert_labels.get(name)
        if got is None:
            return (f"the alert carries no {name} label, and {whose} is {name}={value!r} (render the rules with "
                    f"--group-labels including {name})")
        if got != value:
            return f"{name}={got[:100]!r}: another group's alert ({whose} is {name}={value!r})"
    return None


def group_of(alert_labels: Mapping[str, str], also: Iterable[str] = ()) -> Labels:
    """The group labels an alert carries (RECORDED and `also`), as recorded with its incident."""
    names = dict.fromkeys((*RECORDED, *also))
    return tuple(sorted((n, alert_labels[n][:MAX_VALUE_CHARS]) for n in names if alert_labels.get(n)))


def from_target(target_labels: Mapping[str, str], names: Iterable[str]) -> Labels:
    """A discovered backend's group labels: the target labels named in `discovery.group_labels`."""
    return tuple(sorted((n, target_labels[n][:MAX_VALUE_CHARS]) for n in names if target_labels.get(n)))


def shown(labels: Labels) -> str:
    """`cluster="eu-1",namespace="llm"` (empty when there are none), for reasons and pages."""
    return ",".join(f'{n}="{v}"' for n, v in labels)
