"""The authority's I/O towards one backend: the checks a step calls and the action runner, injectable.

Tests script them; the defaults read the backend with the exporter's code (every request with a total
deadline) and run the restart argv through action.py's wrapper. Every generation request a default check
sends is counted before it goes out (principle 2): exporter.check.verify calls its `on_probe`, and the
remediator's `on_probe` adds one to the store's `probes` counter of the backend and the purpose (`verify`
for a verification, `warmup` for a warm-up check), so nothing outside the remediator is counted.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from llm_health.config import Backend, Config, ConfigError, local_url
from llm_health.exporter.backend import HttpFailure, Target, load_api_key
from llm_health.exporter.observation import FrozenEvidence, Verification, VerifyOutcome
from llm_health.remediator import action as act
from llm_health.remediator import diagnostics, inflight, policy
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.store import StateStore, local_base

log = logging.getLogger("llm_health.remediator")

VERIFY = "verify"              # probe purposes (llm_health_remediator_probes_total{purpose})
WARMUP = "warmup"

Verifier = Callable[[Backend], Verification]
WarmupCheck = Callable[[Backend], tuple[bool, str]]  # -> (ready, why)
InFlightReader = Callable[[Backend], InFlight]
Runner = Callable[[Sequence[str], float, dict[str, str]], act.ActionResult]
OnProbe = Callable[[Backend], None]
Capturer = Callable[[Sequence[str], Mapping[str, str], float, int], diagnostics.Capture]


@dataclass
class BackendIO:
    verifier: Verifier           # may it be restarted? (exporter.check.verify)
    warmup_check: WarmupCheck    # is it back after a restart? (answers, and a healthy verification)
    first_seen_check: WarmupCheck  # may a backend seen for the first time take traffic? (the warm-up gate)
    in_flight: InFlightReader    # how much work a draining backend still has
    runner: Runner               # runs the restart argv
    capturer: Capturer = diagnostics.capture   # runs the diagnostics argv before a kill (bounded)


def default_io(store: StateStore, config: Config, *, verifier: Verifier | None = None,
               warmup_check: WarmupCheck | None = None, first_seen_check: WarmupCheck | None = None,
               in_flight: InFlightReader | None = None, runner: Runner | None = None) -> BackendIO:
    """The given checks, and the defaults for the others (their probes counted in `store`)."""
    counter = ProbeCounter(store)
    verify = verifier or default_verifier(config, counter.counting(VERIFY))
    warm_verify = verifier or default_verifier(config, counter.counting(WARMUP))
    warmup = warmup_check or default_warmup_check(config, warm_verify)
    return BackendIO(
        verifier=verify,
        warmup_check=warmup,
        first_seen_check=first_seen_check or warmup,    # the lifecycle design: one gate before READY
        in_flight=in_flight or default_in_flight(config),
        runner=runner or ActionRunner(action_dir(config)),
    )


class ProbeCounter:
    """Counts each probe in the store before it goes out; a count that cannot be written is logged and never
    stops the check."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def counting(self, purpose: str) -> OnProbe:
        def count(backend: Backend) -> None:
            try:
                with self.store.tx() as tx:
                    tx.bump("probes", f"{backend.name}\t{purpose}")
            except Exception:  # noqa: BLE001 - counting must never stop the restart procedure
                log.exception("could not count a probe to %s", backend.name)
        return count


def read_api_key(config: Config) -> tuple[str, str]:
    """(key, problem): the exporter's API key (`exporter.api_key_file`, exporter.backend.load_api_key), read
    once; ("", "") when not set."""
    path = str(config.exporter.api_key_file or "")
    if not path:
        return "", ""
    try:
        return load_api_key(config.resolve_path(path), "exporter.api_key_file"), ""
    except ConfigError as exc:
        return "", f"API key unreadable: {exc}"


EVIDENCE_TIMEOUT = 2.0        # the exporter's /verdicts: a total deadline; without an answer, verify as before
SIGNATURE_RE = re.compile(r"[0-9a-f]{8,64}")


def exporter_url(config: Config) -> str:
    """Where this config's exporter answers /verdicts ("" = not asked): `remediator.exporter_url`, or by
    default `exporter.listen` of the same file (one file serves both on a host)."""
    url = config.remediator.exporter_url
    if url == "none":
        return ""
    return url or local_url(config.exporter.listen)


def frozen_evidence(base: str, backend: Backend, clock: Callable[[], float] = time.monotonic,
                    timeout: float = EVIDENCE_TIMEOUT) -> FrozenEvidence | None:
    """What the exporter saw of `backend` if it judges it stalled (its frozen counters' signature and for how
    long they stood still); None on anything else: no answer within `timeout`, not stalled, a malformed
    answer. Only ever shortens a verification whose fresh readings show those very counters (check.py)."""
    if not base:
        return None
    try:
        target = Target(base, timeout)
    except ValueError:
        return None
    try:
        answer = target.get(f"/verdicts?backend={quote(backend.name, safe='')}")
        if answer.status != 200:
            return None
        doc = answer.json()
    except (HttpFailure, ValueError, OSError):
        return None
    finally:
        target.close()
    at = clock()
    rows = doc.get("backends") if isinstance(doc, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("backend") != backend.name or row.get("verdict") != "stalled":
            continue
        signature, frozen_for = row.get("progress_signature"), row.get("frozen_for_seconds")
        bound = row.get("stall_bound_seconds")
        if (isinstance(signature, str) and SIGNATURE_RE.fullmatch(signature)
                and isinstance(frozen_for, (int, float)) and not isinstance(frozen_for, bool)
                and 0 <= frozen_for < 86_400):
            good_bound = (isinstance(bound, (int, float)) and not isinstance(bound, bool) and 0 < bound < 86_400)
            return FrozenEvidence(signature, float(frozen_for), at, float(bound) if good_bound else None,
                                  page_is_work_queue=row.get("page_is_work_queue") is True)
    return None


def default_verifier(config: Config, on_probe: OnProbe | None = None,
                     evidence: Callable[[Backend], FrozenEvidence | None] | None = None) -> Verifier:
    """exporter.check.verify with the configured readings; any error is `unknown` (fail closed). `evidence`
    (default: the exporter's /verdicts, `frozen_evidence`) lets the readings reuse how long the counters
    had already stood still."""
    r = config.remediator
    api_key, key_problem = read_api_key(config)
    if evidence is None:
        base = exporter_url(config)

        def evidence(backend: Backend) -> FrozenEvidence | None:
            return frozen_evidence(base, backend)

    def verify_backend(backend: Backend) -> Verification:
        try:
            from llm_health.exporter.check import verify
        except ImportError as exc:
            return Verification(VerifyOutcome.UNKNOWN, f"verifier unavailable: {exc}")
        if key_problem:
            return Verification(VerifyOutcome.UNKNOWN, key_problem)
        extra: dict[str, Any] = {}
        accepts = inspect.signature(verify).parameters
        if api_key and "api_key" in accepts:
            extra["api_key"] = api_key
        if on_probe is not None and "on_probe" in accepts:
            extra["on_probe"] = lambda: on_probe(backend)
        if "evidence" in accepts:
            try:
                extra["evidence"] = evidence(backend)
            except Exception as exc:  # noqa: BLE001 - no evidence is the safe side: the readings span it all
                log.warning("exporter evidence for %s unavailable: %r", backend.name, exc)
        try:
            return verify(
                backend.url, readings=max(2, r.verify_readings), interval=r.verify_interval,
                read_timeout=config.exporter.read_timeout, probe_timeout=config.exporter.probe_timeout,
                sleep=time.sleep, clock=time.monotonic, model=backend.model,   # the evidence's clock too
                stall_ceiling=config.exporter.stall_ceiling, **extra,
            )
        except Exception as exc:  # noqa: BLE001 - a broken verifier must never mean "restart"
            return Verification(VerifyOutcome.UNKNOWN, f"verification raised {exc!r}")

    return verify_backend


def default_answer_check(config: Config) -> WarmupCheck:
    """/health 200 and /v1/models 200 listing the configured model; no generation request: the first
    half of the warm-up gate. Each request has a total deadline (read_timeout): a server that drips its
    answer costs at most that."""
    timeout = config.exporter.read_timeout

    def check(backend: Backend) -> tuple[bool, str]:
        target = Target(backend.url, timeout)
        try:
            health = target.get("/health")
            if health.status != 200:
                return False, f"/health answered {health.status}"
            models = target.get("/v1/models")
            if models.status != 200:
                return False, f"/v1/models answered {models.status}"
            if backend.model:
                data = models.json().get("data", [])
                ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
                if backend.model not in ids:
                    return False, f"/v1/models does not list {backend.model!r} yet"
        except HttpFailure as exc:
            return False, f"not answering: {exc.kind}: {exc.detail}"
        except (ValueError, AttributeError) as exc:
            return False, f"/v1/models unreadable: {exc.__class__.__name__}"
        finally:
            target.close()
        return True, "answers /health and /v1/models"

    return check


def default_warmup_check(config: Config, verifier: Verifier) -> WarmupCheck:
    """Warm = /health 200, /v1/models 200 (listing the configured model), and a healthy verification:
    engine progress, or (idle) a one-token request that succeeds (exporter.check.verify)."""
    answers = default_answer_check(config)

    def check(backend: Backend) -> tuple[bool, str]:
        ok, why = answers(backend)
        if not ok:
            return False, why
        v = verifier(backend)
        if v.outcome in policy.HEALTHY_OUTCOMES:
            return True, f"answers again: /health, /v1/models, verify {v.outcome}"
        return False, f"verify {v.outcome}: {v.reason}"

    return check


def default_in_flight(config: Config) -> InFlightReader:
    r = config.remediator

    def read(backend: Backend) -> InFlight:
        sock = str(config.resolve_path(r.haproxy_socket)) if r.haproxy_socket else ""
        return inflight.read_in_flight(backend, config.exporter.read_timeout, sock, r.haproxy_proxy)

    return read


class ActionRunner:
    """The default runner: the argv runs through action.py's wrapper; its pid, output and exit status
    go to files under `folder` (next to the state file), named by the action id, so that a later
    authority can collect the result of an action this one did not live to see finish."""

    keeps_files = True

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, argv: Sequence[str], timeout: float, env: dict[str, str]) -> act.ActionResult:
        return act.run_action(argv, timeout, env, folder=self.folder, key=env.get("LLM_HEALTH_ACTION", "action"))


def diagnostics_dir(config: Config) -> Path:
    """Where diagnostics captures keep their files (pages, stacks): one folder per incident, beside the state."""
    base = local_base(config)
    return base.with_name(base.name + ".diagnostics")


def action_dir(config: Config) -> Path:
    base = local_base(config)
    return base.with_name(base.name + ".actions")
