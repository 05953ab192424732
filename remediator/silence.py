"""Alertmanager API v2 silences for one backend while it is being restarted.

`create_silence(am_url, backend, minutes, comment, created_by) -> silence id` mutes every alert with
the label `backend="<name>"` (exact match: isRegex false, isEqual true) from now for `minutes`.
`expire_silence(am_url, silence_id)` ends it early (DELETE /api/v2/silence/{id}, singular path).
Alertmanager 0.25 answers 500 "silence not found" for an unknown id (newer ones 404): that counts as
already gone, not as an error.

Bad input (backend name, id, minutes) raises SilenceError before any request is sent. Transport
errors, timeouts and unexpected answers raise SilenceError naming the URL and the status. Every call
ends by its `timeout` (a total deadline: llm_health/http_client.py), whatever Alertmanager does.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from llm_health.config import NAME_RE
from llm_health.http_client import HttpFailure, Response, fetch
from llm_health.redact import redact

DEFAULT_TIMEOUT = 5.0
SILENCE_ID_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class SilenceError(RuntimeError):
    """A silence could not be created or expired; the message says why."""


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _base(am_url: str) -> str:
    if not isinstance(am_url, str) or not am_url.startswith(("http://", "https://")):
        raise SilenceError(f"alertmanager url {am_url!r} must start with http:// or https://")
    return am_url.rstrip("/") + "/api/v2"


def silence_body(
    backend: str, minutes: float, comment: str, created_by: str, now: datetime
) -> dict[str, object]:
    """The POST /api/v2/silences body (pure; validated)."""
    if not isinstance(backend, str) or not NAME_RE.match(backend):
        raise SilenceError(f"backend name {backend!r} must match {NAME_RE.pattern}")
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not 0 < minutes <= 7 * 24 * 60:
        raise SilenceError(f"silence length must be > 0 and at most a week, got {minutes!r} minutes")
    if not isinstance(comment, str) or not comment.strip():
        raise SilenceError("a silence needs a comment (Alertmanager requires one)")
    if not isinstance(created_by, str) or not created_by.strip():
        raise SilenceError("a silence needs created_by")
    return {
        "matchers": [{"name": "backend", "value": backend, "isRegex": False, "isEqual": True}],
        "startsAt": _iso(now),
        "endsAt": _iso(now + timedelta(minutes=minutes)),
        "createdBy": created_by.strip(),
        "comment": comment.strip(),
    }


def _describe(resp: Response) -> str:
    text = resp.text.strip().replace("\n", " ")
    return f"HTTP {resp.status}: {text[:300]}"


def create_silence(
    am_url: str,
    backend: str,
    minutes: float,
    comment: str,
    created_by: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    now: datetime | None = None,
) -> str:
    """Silence alerts with backend="<backend>" for `minutes`; return the silence id."""
    body = silence_body(backend, minutes, comment, created_by, now or datetime.now(UTC))
    url = _base(am_url) + "/silences"
    try:
        resp = fetch("POST", url, timeout=timeout, json_body=body)
    except HttpFailure as exc:
        raise SilenceError(f"cannot create silence for {backend} at {redact(url)}: {exc.kind}: {exc}") from exc
    if resp.status != 200:
        raise SilenceError(f"alertmanager refused the silence for {backend} at {url}: {_describe(resp)}")
    try:
        silence_id = resp.json()["silenceID"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SilenceError(f"unexpected answer from {url}: {_describe(resp)}") from exc
    if not isinstance(silence_id, str) or not SILENCE_ID_RE.match(silence_id):
        raise SilenceError(f"unexpected silence id from {url}: {silence_id!r}")
    return silence_id


def _check_id(silence_id: str) -> None:
    if not isinstance(silence_id, str) or not SILENCE_ID_RE.match(silence_id):
        raise SilenceError(f"silence id {silence_id!r} must match {SILENCE_ID_RE.pattern}")


def _one_silence(method: str, am_url: str, silence_id: str, doing: str, timeout: float) -> tuple[Response, str]:
    """`method` on /api/v2/silence/{id} (singular path): the answer and the URL; SilenceError when no answer."""
    _check_id(silence_id)
    url = f"{_base(am_url)}/silence/{silence_id}"
    try:
        return fetch(method, url, timeout=timeout), url
    except HttpFailure as exc:
        raise SilenceError(f"cannot {doing} silence {silence_id} at {redact(url)}: {exc.kind}: {exc}") from exc


def _unknown(resp: Response) -> bool:
    """Alertmanager does not know the id (0.25: 500 "silence not found"; newer: 404)."""
    return resp.status == 404 or (resp.status == 500 and "not found" in resp.text.lower())


def expire_silence(
    am_url: str,
    silence_id: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> bool:
    """Expire a silence. True = expired now (or it had already expired); False = Alertmanager does not
    know it (0.25: 500 "silence not found"; newer: 404), i.e. it is gone anyway."""
    resp, url = _one_silence("DELETE", am_url, silence_id, "expire", timeout)
    if resp.status == 200:
        return True
    if _unknown(resp):
        return False
    raise SilenceError(f"alertmanager did not expire silence {silence_id} at {url}: {_describe(resp)}")


def get_silence(
    am_url: str,
    silence_id: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, object] | None:
    """GET /api/v2/silence/{id}: the silence object, or None when Alertmanager does not know it."""
    resp, url = _one_silence("GET", am_url, silence_id, "read", timeout)
    if _unknown(resp):
        return None
    if resp.status != 200:
        raise SilenceError(f"cannot read silence {silence_id} at {url}: {_describe(resp)}")
    try:
        data = resp.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise SilenceError(f"unexpected answer from {url}: {_describe(resp)}")
    return data
