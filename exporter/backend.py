"""HTTP I/O to one server (`/metrics`, `/health`, `/v1/models`), nothing else.

Every exchange goes through `llm_health.http_client.Target`: one kept-alive connection per target and
a TOTAL deadline per exchange (connect, headers and body), so a server that drips its answer holds a
worker for at most its timeout. At 1000 backends per interval the cost of a request matters more than
convenience, hence plain `http.client` underneath. One `Target` is used by one thread at a time (the
fleet never has two reads of one backend in flight); the probe and the /health check have their own.

With an API key (vLLM `--api-key` protects `/v1/*` only) the key goes as `Authorization: Bearer`
on `/v1/*` requests; `/metrics` and `/health` stay unauthenticated, as in vLLM.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from llm_health.config import ConfigError
from llm_health.exporter.observation import Observation, ReadResult
from llm_health.exporter.reading import EngineProps, Reading, read_text
from llm_health.http_client import FailureKind, HttpFailure, Response
from llm_health.http_client import Target as _Target

__all__ = ["HttpFailure", "Response", "Target", "observe", "answers",
           "first_model", "first_model_entry", "load_api_key"]

USER_AGENT = "llm-health-exporter"
#: the most of one answer a backend may send: a /metrics page of a real server is well under 1 MiB (a few
#: engines' histograms); parsing a 28 MiB one held the GIL for 3.5 s
PAGE_MAX_BYTES = 8 * 1024 * 1024
#: less time than this left of a reading's deadline: no more exchange is begun in it
TOO_LITTLE_LEFT = 0.05
START_HEADER = "Process-Start-Time-Unix"  # llama-server: changes on every restart (no identity series)


class Target(_Target):
    """A backend: the deadline client with the exporter's User-Agent, and what llama.cpp's /props said
    of the context size of the process that answers (asked again after a restart)."""

    def __init__(self, url: str, timeout: float, api_key: str = "") -> None:
        super().__init__(url, timeout, api_key, user_agent=USER_AGENT, max_bytes=PAGE_MAX_BYTES)
        self.context: tuple[float | None, float] | None = None    # (start header, context tokens)


_KIND_TO_READ = {FailureKind.REFUSED: ReadResult.REFUSED, FailureKind.TIMEOUT: ReadResult.TIMEOUT, FailureKind.ERROR: ReadResult.ERROR}


HEALTH = ("/health",)
MODELS = ("/v1/models",)
CHEAP = ("/health", "/v1/models")


def answers(target: Target, paths: tuple[str, ...] = HEALTH, timeout: float | None = None) -> bool:
    """Does the server's HTTP side live? True when one of `paths` answers 200 (no generation involved):
    `/health` after a timeout, `/health` or `/v1/models` when the page has no engine metrics, `/v1/models`
    through a proxy. All of them within `timeout` (default: the target's), one deadline for the lot."""
    deadline = time.monotonic() + (target.timeout if timeout is None else timeout)
    for path in paths:
        left = deadline - time.monotonic()
        if left <= TOO_LITTLE_LEFT:
            break
        try:
            if target.get(path, timeout=left).status == 200:
                return True
        except HttpFailure:
            continue
    return False


def _cheap(target: Target, left: float) -> bool | None:
    """The cheap endpoints within what is left of the reading's deadline; None: no time left to ask."""
    return answers(target, CHEAP, left) if left > TOO_LITTLE_LEFT else None


def load_api_key(path: str | Path, where: str = "api_key_file") -> str:
    """The API key in `path` (stripped); "" for no path. A missing, unreadable or empty file is an error."""
    if not str(path):
        return ""
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read {str(path)!r}: {exc.__class__.__name__}") from None
    if not key or any(c in key for c in "\r\n"):
        raise ConfigError(f"{where}: {str(path)!r} must hold one non-empty line")
    return key


def observe(target: Target) -> Observation:
    """Read /metrics once; when the page has no engine series, ask the cheap endpoints instead."""
    try:
        resp = target.get("/metrics")
    except HttpFailure as exc:
        return Observation(outcome=_KIND_TO_READ[exc.kind], detail=exc.detail)
    left = target.timeout - resp.seconds      # the reading's one deadline covers the cheap endpoints too
    if resp.status == 404:
        return Observation(outcome=ReadResult.NOT_FOUND, detail="404", cheap_ok=_cheap(target, left))
    if resp.status != 200:
        return Observation(outcome=ReadResult.ERROR, detail=f"HTTP {resp.status}")
    try:
        reading = read_text(resp.text, resp.header(START_HEADER))
    except Exception as exc:  # noqa: BLE001 - a parser bug must not kill the cycle
        return Observation(outcome=ReadResult.ERROR, detail=f"unreadable page: {exc}")
    if not reading.has_engine_metrics:
        return Observation(outcome=ReadResult.OK, reading=reading, cheap_ok=_cheap(target, left))
    if reading.flavour == "llamacpp":
        reading = reading.with_props(llamacpp_props(target, reading, left))
    return Observation(outcome=ReadResult.OK, reading=reading)


def llamacpp_props(target: Target, reading: Reading, timeout: float) -> EngineProps | None:
    """llama.cpp's /props (answered by its HTTP thread, also while it sleeps): whether it sleeps
    (`--sleep-idle-seconds`; its /metrics page does not say), asked at every idle reading since a probe
    may follow it, and the context size that bounds one step (exporter/steptime.py), asked once per
    process. Within what is left of the reading's deadline; None when it cannot be had (then an idle
    llama.cpp is not probed: its sleep state is not known)."""
    cached = target.context
    context = cached[1] if cached is not None and cached[0] == reading.start_header else None
    if reading.work > 0 and context is not None:
        return EngineProps(sleeping=False, context_tokens=context)   # it never sleeps with work
    if timeout <= TOO_LITTLE_LEFT:
        return EngineProps(context_tokens=context) if context is not None else None
    try:
        resp = target.get("/props", timeout=timeout)
        doc = resp.json() if resp.status == 200 else None
    except (HttpFailure, ValueError):
        doc = None
    if not isinstance(doc, dict):
        return EngineProps(context_tokens=context) if context is not None else None
    sleeping = doc.get("is_sleeping")
    settings = doc.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    slots = doc.get("total_slots")
    if isinstance(n_ctx, int | float) and n_ctx > 0:
        context = float(n_ctx) * (slots if isinstance(slots, int) and slots > 0 else 1)
        target.context = (reading.start_header, context)
    return EngineProps(sleeping=sleeping if isinstance(sleeping, bool) else None, context_tokens=context)


def first_model_entry(target: Target) -> dict[str, Any]:
    """The first entry of /v1/models' `data` list (`id`, `owned_by`, ...)."""
    resp = target.get("/v1/models")
    if resp.status != 200:
        raise HttpFailure("error", f"/v1/models: HTTP {resp.status}", resp.status)
    try:
        entry = json.loads(resp.body)["data"][0]
        if not isinstance(entry, dict):
            raise TypeError(f"a model entry is {type(entry).__name__}")
        return entry
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise HttpFailure("error", "/v1/models lists no model") from exc


def first_model(target: Target) -> str:
    """The first model id listed by /v1/models."""
    entry = first_model_entry(target)
    if "id" not in entry:
        raise HttpFailure("error", "/v1/models lists no model")
    return str(entry["id"])
