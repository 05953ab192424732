"""What one look at a backend found: the words shared by the I/O layer (backend.py, probe.py) and the
verdict (verdict.py), so that the I/O layer never imports the decision module.

* `ReadResult`: how one `/metrics` read ended (the `result` label of `llm_health_readings_total`);
* `ProbeOutcome` and `ProbeResult`: how one idle probe ended (`llm_health_probes_total{result}`);
* `Observation`: one reading as the verdict gets it (the page read, or how it failed, and the probe
  that finished since the previous judgement).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llm_health.exporter.reading import Reading


class ReadResult(StrEnum):
    OK = "ok"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    ERROR = "error"
    NOT_FOUND = "not_found"


class ProbeOutcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class ProbeResult:
    outcome: ProbeOutcome
    detail: str = ""
    seconds: float = 0.0
    status: int = 0        # HTTP status of the answer (0: none came back)

    @property
    def rejected(self) -> bool:
        """The server answered but refused the request (4xx): the probe is misconfigured, not failed."""
        return 400 <= self.status < 500

    @property
    def unanswered(self) -> bool:
        """No answer in time (a timeout, or 504): the request may still sit in the engine's queue."""
        return self.outcome == ProbeOutcome.TIMEOUT or self.status == 504


def rejection_hint(status: int) -> str:
    """What to check when a probe is rejected with `status`."""
    if status in (401, 403):
        return "set exporter.api_key_file?"
    if status == 404:
        return "wrong model? set exporter.probe_model or the backend's model"
    if status in (400, 422):
        return "can the model do completions? set exporter.probe_model"
    return "check the probe's model and API key"


def rejection_text(probe: ProbeResult) -> str:
    """`probe rejected: HTTP 401 — set exporter.api_key_file?`"""
    return f"probe rejected: {probe.detail or f'HTTP {probe.status}'} — {rejection_hint(probe.status)}"


@dataclass(frozen=True)
class Observation:
    """What one look at a backend learned."""

    outcome: ReadResult                   # how the /metrics read ended
    reading: Reading | None = None        # parsed page when outcome is OK
    detail: str = ""                      # error text for the reason
    cheap_ok: bool | None = None          # /health or /v1/models answered (asked when there are no metrics;
                                          # on a timeout: /health answered, None when not asked)
    probe: ProbeResult | None = None      # a probe that finished since the previous judgement
    answered: float | None = None         # a slow answer: when it arrived, on the judge's clock (None: promptly,
                                          # at the judged time). The page's counters may be from any moment
                                          # up to this, so nothing counts them as frozen before it


class VerifyOutcome(StrEnum):
    """What fresh direct readings say about restarting a server (exporter/check.py `verify`)."""

    PROGRESS = "progress"          # every engine with work moved: do not restart
    IDLE_OK = "idle_ok"            # idle and the probe answered: do not restart
    NO_PROGRESS = "no_progress"    # an engine with work is frozen for longer than its steps explain
    DOWN = "down"                  # refused / errors on every reading, or idle and the probe failed twice
    UNRESPONSIVE = "unresponsive"  # every reading and /health timed out: a hung server
    RESTARTED = "restarted"        # another process answered: someone restarted it
    SLEEPING = "sleeping"          # the engine sleeps on purpose: never restarted for it
    UNKNOWN = "unknown"            # cannot tell (fail closed)


@dataclass(frozen=True)
class FrozenEvidence:
    """What the exporter saw of a stalled backend (its /verdicts): the signature of the frozen counters
    (`verdict.progress_signature`) and for how long they had stood still when it answered; `at` is the
    verifier's own clock at that answer (the monotonic one verify() times its readings with). Reused only
    when a fresh reading shows the same signature."""
    signature: str
    frozen_for: float
    at: float
    bound: float | None = None     # the exporter's stall bound (it knows this process's history; None: unknown)
    page_is_work_queue: bool = False   # its last page came from the inference loop (llama.cpp,
                                       # verdict.page_is_work_queue): a page that hangs is the loop's own work


@dataclass(frozen=True)
class Verification:
    outcome: VerifyOutcome
    reason: str
    in_flight: float = 0.0         # running + waiting at the last good reading (0 when unknown)

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", VerifyOutcome(self.outcome))   # "progress" -> the enum; else ValueError
