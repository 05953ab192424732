"""Audit event details: clipped value by value BEFORE encoding, so a detail is always valid JSON of at most
DETAIL_LIMIT characters; details stored by older versions (cut after encoding) never break a reader.
Dialect-free: every store encodes and decodes details with these.
"""

from __future__ import annotations

import json
from typing import Any

#: event kinds that are decisions (counted in llm_health_remediator_decisions_total)
DECISION_KINDS = frozenset({
    "deduplicated", "ignored", "signal", "absorbed", "incident_opened", "verified_asleep",
    "deferred_breaker", "deferred_budget", "deferred_backoff", "deferred_marker", "deferred_unknown",
    "verified_healthy", "restarted_by_other", "restarting", "restarted", "would_restart", "not_configured",
    "failed", "recovered", "warmup_timeout", "interrupted", "aborted", "resolved", "acknowledged", "breaker_open",
    "draining", "deferred_host", "deferred_min_ready", "restart_called_off", "escalated", "lifecycle_refused",
    "stale_firing", "deferred_concurrency", "deferred_paused",
})

#: an event's detail is at most this long once encoded; values are shortened BEFORE encoding
DETAIL_LIMIT = 8000
_VALUE_LIMIT = 1000      # characters of one string value in a detail
_ITEMS_LIMIT = 40        # entries of one list or mapping in a detail
_DEPTH_LIMIT = 6


def clip(value: Any, depth: int = 0) -> Any:
    """A JSON-encodable copy of `value` with long strings, lists, mappings and deep nesting cut
    (marked with an ellipsis); lone surrogates are replaced. Encoding the result never needs cutting."""
    if isinstance(value, str):
        text = value if len(value) <= _VALUE_LIMIT else value[:_VALUE_LIMIT] + "…"
        return text.encode("utf-8", "replace").decode("utf-8")
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= _DEPTH_LIMIT:
        return clip(str(value)[:200], depth)
    if isinstance(value, dict):
        items = list(value.items())
        out = {clip(str(k))[:200]: clip(v, depth + 1) for k, v in items[:_ITEMS_LIMIT]}
        if len(items) > _ITEMS_LIMIT:
            out["…"] = f"{len(items) - _ITEMS_LIMIT} more"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = list(value)
        out_list = [clip(v, depth + 1) for v in seq[:_ITEMS_LIMIT]]
        if len(seq) > _ITEMS_LIMIT:
            out_list.append(f"… {len(seq) - _ITEMS_LIMIT} more")
        return out_list
    return clip(str(value), depth)


def encode_detail(detail: dict[str, Any]) -> str:
    """Always valid JSON of at most DETAIL_LIMIT characters."""
    text = json.dumps(clip(detail))
    if len(text) <= DETAIL_LIMIT:
        return text
    # still too long (many long values): keep a readable preview as one string value
    return json.dumps({"truncated": True, "preview": text[: DETAIL_LIMIT // 2]})


def decode_detail(raw: str | None) -> Any:
    """Stored details from any version (older ones were cut after encoding) never break a reader."""
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return {"unreadable": (raw or "")[:2000]}
