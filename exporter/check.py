"""`llm-health check URL` (one-shot verdict, Nagios exit codes) and `verify(...)` for the remediator.

Both take a few fresh, direct readings of the server's /metrics a little apart and compare them
with the same rules as the exporter (exporter.verdict): engine progress is judged from counters,
per engine, a probe goes out only when the last reading shows no work, counters of two processes
are never compared.

`verify()` outcomes (docs/design.md §3):

* progress      every engine with work moved across the readings (an engine without work is fine)
* idle_ok       no work and the probe answered
* no_progress   an engine with work is frozen across all readings (the reason names it), for longer than
                its own steps can explain: when the engine's numbers say one step can take longer than
                the readings span (exporter/steptime.py), more readings are taken, `interval` apart, until
                they span it (at most `stall_ceiling`). `evidence` (the exporter's, FrozenEvidence): when the
                first fresh reading shows the very counters the exporter saw frozen, they have stood still
                since then, and that time counts toward the span: the alert's evidence is not waited out
                again, only what could have changed is re-checked (issue 25)
* down          refused / errors on every reading, or idle and the probe failed twice (refused,
                timeout, 5xx), or no metrics and the cheap endpoints fail
* no_progress   (also) llama.cpp: every reading timed out while /health answers; its /metrics is a
                task of the inference loop, so the loop is stuck. Known as llama.cpp by /v1/models'
                `owned_by`, or, when /v1/models times out too (a loop stopped holding its queue's lock),
                by the exporter's evidence that it reads this server's pages from llama.cpp's loop
* unresponsive  every reading timed out (connection accepted, no answer within read_timeout) and
                /health did not answer either: a hung server, neither down nor merely slow
* restarted     another process answered between two readings
* sleeping      the engine says it sleeps on purpose (vLLM sleep mode, llama.cpp --sleep-idle-seconds):
                never probed; a sleeping server is never restarted (a wake-up is not a restart)
* unknown       cannot tell: e.g. /metrics slow but /health fine, no metrics, a probe rejected
                with HTTP 4xx (a misconfigured probe: API key, model; never counted as down)

The API key (vLLM `--api-key`) goes as a bearer token on /v1/* only (probe, /v1/models).
`on_probe` is called right before each probe goes out (the remediator counts its probes with it).
`check` exit codes: 0 idle/busy/restarted, 1 no_metrics/unknown (also unresponsive), 2 stalled/down.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from llm_health.config import ConfigError, _check_url
from llm_health.exporter.backend import (
    HttpFailure,
    Target,
    answers,
    first_model_entry,
    load_api_key,
    observe,
)
from llm_health.exporter.observation import (
    FrozenEvidence,
    Observation,
    ProbeOutcome,
    ReadResult,
    Verification,
    VerifyOutcome,
    rejection_text,
)
from llm_health.exporter.probe import Prober
from llm_health.exporter.reading import Reading, rate_text, rates
from llm_health.exporter.steptime import required_span
from llm_health.exporter.verdict import (
    Verdict,
    may_probe_engine,
    other_process,
    progress_signature,
    progressed,
)
from llm_health.http_client import FailureKind
from llm_health.redact import redact

DEFAULT_CEILING = 900.0   # exporter.stall_ceiling's default
OnProbe = Callable[[], None]


def _work(r: Reading) -> str:
    return f"{r.running:g} running, {r.waiting:g} waiting"


def _examine(
    url: str,
    readings: int,
    interval: float,
    read_timeout: float,
    probe_timeout: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    probe: bool,
    model: str = "",
    api_key: str = "",
    stall_ceiling: float = DEFAULT_CEILING,
    on_probe: OnProbe | None = None,
    evidence: FrozenEvidence | None = None,
) -> tuple[Verification, Verdict]:
    target = Target(url, read_timeout, api_key)
    seen: list[tuple[Observation, float]] = []

    def look() -> tuple[Observation, float]:
        """One reading, at the time it was asked for; `answered`: when its answer came (its counters may be
        from any moment in between, so a frozen span is counted from the first answer to the last ask)."""
        sent = clock()
        obs = observe(target)
        return replace(obs, answered=clock()), sent

    try:
        for i in range(max(1, readings)):
            if i:
                sleep(interval)
            seen.append(look())
        # frozen with work over a span one of this engine's steps can explain: read on until it cannot
        while interval > 0 and (need := _more_span_needed(seen, stall_ceiling, evidence)) > 0:
            sleep(min(interval, need))
            seen.append(look())
    finally:
        target.close()
    result, verdict = _judge_seen(url, seen, read_timeout, probe_timeout, probe, model, api_key, stall_ceiling,
                                  on_probe, evidence)
    good = _good(seen)
    before = frozen_before(good[0], evidence) if good else 0.0
    if result.outcome == VerifyOutcome.NO_PROGRESS and before > 0:
        result = replace(result, reason=f"{result.reason}; the very counters the exporter saw frozen, "
                                        f"{before:.0f} s before the first of them")
    return result, verdict


def _usable(o: Observation) -> bool:
    return o.outcome == ReadResult.OK and o.reading is not None and o.reading.has_engine_metrics


def _good(seen: list[tuple[Observation, float]]) -> list[tuple[Reading, float]]:
    return [(o.reading, t) for o, t in seen if _usable(o) and o.reading is not None]


def _frozen_from(seen: list[tuple[Observation, float]]) -> float:
    """Since when the first good reading's counters are known to stand: when its answer came (a slow
    answer may show the counters of its last moment), or when it was asked for without that time."""
    for o, t in seen:
        if _usable(o):
            return t if o.answered is None else max(t, o.answered)
    return 0.0


def _more_span_needed(seen: list[tuple[Observation, float]], ceiling: float,
                      evidence: FrozenEvidence | None = None) -> float:
    """Seconds more the readings must span before frozen counters prove a stall (0: enough, or not frozen)."""
    good = _good(seen)
    if len(good) < 2 or len(good) != len(seen):
        return 0.0
    frozen_from = _frozen_from(seen)
    judged = _engines(good, all_good=True, frozen_from=frozen_from)
    if judged is None or judged[0].outcome != VerifyOutcome.NO_PROGRESS:
        return 0.0
    before = frozen_before(good[0], evidence)
    span = max(0.0, good[-1][1] - frozen_from) + before
    required = required_span(good[-1][0], 0.0, ceiling)
    if before > 0 and evidence is not None and evidence.bound is not None:
        # the same counters the exporter judged with this process's history (steps seen chunked, pauses
        # seen end): its bound is the better one (the page alone cannot tell a chunked prefill from a step)
        required = min(required, evidence.bound)
    return max(0.0, min(required, ceiling) - span)


def frozen_before(first: tuple[Reading, float], evidence: FrozenEvidence | None) -> float:
    """How long the counters of the first fresh reading had already stood still, by the exporter's
    evidence: 0 without it, or when the counters are not the ones it saw frozen (they moved since)."""
    reading, t = first
    if evidence is None or progress_signature(reading) != evidence.signature:
        return 0.0
    return max(0.0, evidence.frozen_for + max(0.0, t - evidence.at))


def _judge_seen(url: str, seen: list[tuple[Observation, float]], read_timeout: float, probe_timeout: float,
                probe: bool, model: str, api_key: str, stall_ceiling: float,
                on_probe: OnProbe | None = None,
                evidence: FrozenEvidence | None = None) -> tuple[Verification, Verdict]:
    good = _good(seen)
    outcomes = [o.outcome for o, _ in seen]

    # another process answered between two readings: someone restarted it
    for (a, _), (b, _) in zip(good, good[1:], strict=False):
        why = other_process(a, b)
        if why:
            return Verification(VerifyOutcome.RESTARTED, f"another process answered: {why}", b.work), Verdict.RESTARTED

    if not good:
        return _without_readings(url, read_timeout, seen, evidence)

    last = good[-1][0]
    if last.asleep:
        return (Verification(VerifyOutcome.SLEEPING, f"asleep ({last.sleep.value}): not probed, never restarted for it; "
                             f"{_work(last)}", last.work), Verdict.SLEEPING)
    judged = _engines(good, all_good=len(good) == len(seen), frozen_from=_frozen_from(seen))
    if judged is not None:
        return judged

    if last.work <= 0:
        if not probe:
            return Verification(VerifyOutcome.UNKNOWN, f"{_work(last)}; not probed", 0.0), Verdict.IDLE
        latest = seen[-1][0]
        if not _usable(latest) or latest.reading is not last:
            # idle was an older page: a look that timed out since may be a server slow under new work
            return (Verification(VerifyOutcome.UNKNOWN, f"{_work(last)} on an older page, then /metrics "
                                 f"{latest.outcome}: not probed", 0.0), Verdict.UNKNOWN)
        if not may_probe_engine(last):
            return (Verification(VerifyOutcome.UNKNOWN, f"{_work(last)}; not probed: llama.cpp's /props did not say whether it "
                                 "sleeps", 0.0), Verdict.IDLE)
        return _probe_idle(url, probe_timeout, read_timeout, last, model, api_key, on_probe)
    return (Verification(VerifyOutcome.UNKNOWN, f"{_work(last)}; not enough readings to judge progress "
                         f"({', '.join(outcomes)})", last.work), Verdict.UNKNOWN)


def _without_readings(
    url: str, read_timeout: float, seen: list[tuple[Observation, float]], evidence: FrozenEvidence | None = None
) -> tuple[Verification, Verdict]:
    outcomes = [o.outcome for o, _ in seen]
    if all(o in (ReadResult.REFUSED, ReadResult.ERROR) for o in outcomes):
        detail = seen[-1][0].detail or seen[-1][0].outcome
        return Verification(VerifyOutcome.DOWN, f"every reading failed ({len(seen)}): {detail}", 0.0), Verdict.DOWN
    no_metrics = [o for o, _ in seen if o.outcome in (ReadResult.OK, ReadResult.NOT_FOUND)]
    if no_metrics and len(no_metrics) == len(seen):
        if all(o.cheap_ok is False for o in no_metrics):
            return (Verification(VerifyOutcome.DOWN, "no engine metrics and /health, /v1/models fail on every reading", 0.0),
                    Verdict.DOWN)
        return (Verification(VerifyOutcome.UNKNOWN, "no engine metrics on /metrics; /health or /v1/models answer", 0.0),
                Verdict.NO_METRICS)
    if ReadResult.TIMEOUT in outcomes:
        timeouts = f"/metrics timed out ({outcomes.count(ReadResult.TIMEOUT)} of {len(seen)})"
        if all(o == ReadResult.TIMEOUT for o in outcomes):
            target = Target(url, read_timeout)
            try:
                fine = answers(target)
            finally:
                target.close()
            if not fine:
                return (Verification(VerifyOutcome.UNRESPONSIVE, f"{timeouts}; /health did not answer within "
                                     f"{read_timeout:g} s either", 0.0), Verdict.UNKNOWN)
            owner = _owned_by(url, read_timeout)
            if owner == "llamacpp":
                # llama.cpp serves /metrics from its inference loop (exporter.verdict.page_is_work_queue)
                return (Verification(VerifyOutcome.NO_PROGRESS, f"{timeouts}, /health fine: llama.cpp's inference loop "
                                     "does not serve its queue (/metrics is one of its tasks)", 0.0),
                        Verdict.STALLED)
            if owner is None and evidence is not None and evidence.page_is_work_queue:
                # /v1/models timed out too: a llama.cpp loop stopped while holding its queue's lock hangs every
                # endpoint but /health. That it is llama.cpp comes from the exporter, which judges it stalled
                # from its pages; without that evidence nothing here says which engine this is
                return (Verification(VerifyOutcome.NO_PROGRESS, f"{timeouts}, /health fine, /v1/models timed out too: "
                                     "the exporter reads this server's pages from llama.cpp's inference loop and "
                                     "judges it stalled; the loop does not serve its queue", 0.0),
                        Verdict.STALLED)
            return Verification(VerifyOutcome.UNKNOWN, f"{timeouts}; /metrics slow, /health fine", 0.0), Verdict.UNKNOWN
        return Verification(VerifyOutcome.UNKNOWN, timeouts, 0.0), Verdict.UNKNOWN
    return Verification(VerifyOutcome.UNKNOWN, f"no usable reading ({', '.join(outcomes)})", 0.0), Verdict.UNKNOWN


def _owned_by(url: str, read_timeout: float) -> str | None:
    """`owned_by` of the first model on /v1/models (llama.cpp answers it without its loop, also while the
    loop is stuck, unless the loop holds its queue's lock); "" when the answer does not say, None when no
    answer came within `read_timeout`."""
    target = Target(url, read_timeout)
    try:
        return str(first_model_entry(target).get("owned_by", ""))
    except HttpFailure as exc:
        return None if exc.kind == FailureKind.TIMEOUT else ""
    finally:
        target.close()


def _engines(good: list[tuple[Reading, float]], all_good: bool,
             frozen_from: float) -> tuple[Verification, Verdict] | None:
    """Per engine, like the exporter's worst-engine verdict; None when it comes down to the probe.

    no_progress: an engine with work in every reading whose counters never moved (needs >= 2 readings,
    all of them good). progress: every engine with work at the last reading moved (or, with no work
    left, something moved: work finished). Otherwise unknown. Readings are at the times they were asked
    for; `frozen_from`: since when the first one's counters are known (`_frozen_from`: its answer).
    """
    last, t_last = good[-1]
    multi = len(last.engines) > 1
    pairs = list(zip(good, good[1:], strict=False))

    def moved(key: str) -> bool:
        for (a, _), (b, _) in pairs:
            old, new = a.engines.get(key), b.engines.get(key)
            if old is not None and new is not None and progressed(old, new):
                return True
        return False

    def frozen(key: str) -> bool:
        return (len(good) >= 2 and all_good and not moved(key)
                and all(key in r.engines and r.engines[key].work > 0 for r, _ in good))

    def name(key: str) -> str:
        return f"engine {key}: " if multi else ""

    busy = [key for key, eng in last.engines.items() if eng.work > 0]
    for key in busy:
        if frozen(key):
            eng = last.engines[key]
            return (Verification(VerifyOutcome.NO_PROGRESS, f"{name(key)}{_work(eng)}, no engine progress for "
                                 f"{max(0.0, t_last - frozen_from):.0f} s across {len(good)} readings", last.work),
                    Verdict.STALLED)
    if len(good) < 2:
        return None
    if busy:
        still = [key for key in busy if not moved(key)]
        if still:
            eng = last.engines[still[0]]
            return (Verification(VerifyOutcome.UNKNOWN, f"{name(still[0])}{_work(eng)}, no engine progress seen yet, "
                                 f"too few good readings with work to call it frozen", last.work), Verdict.UNKNOWN)
    elif not any(moved(key) for key in last.engines):
        return None  # idle and quiet: the probe decides
    (a, ta), (b, tb) = good[-2], good[-1]
    dt = max(tb - ta, 1e-9)
    tps, sps = rates(a, b, dt)
    return (Verification(VerifyOutcome.PROGRESS, f"{_work(b)}, engine progressing ({rate_text(b, tps, sps)})", b.work),
            Verdict.BUSY if b.work > 0 else Verdict.IDLE)


def _any_progress(old: Reading, new: Reading) -> bool:
    return any(progressed(eng, new.engines[key]) for key, eng in old.engines.items() if key in new.engines)


def _probe_idle(
    url: str, probe_timeout: float, read_timeout: float, last: Reading, model: str, api_key: str = "",
    on_probe: OnProbe | None = None,
) -> tuple[Verification, Verdict]:
    """Idle: ask for an answer. A failure is retried once after a fresh reading that is still idle.

    A rejected probe (HTTP 4xx) is a misconfigured probe: unknown at once, never down.
    """
    prober = Prober(url, probe_timeout, model, api_key)
    try:
        failures: list[str] = []
        for _attempt in range(2):
            if on_probe is not None:
                on_probe()                  # before it goes out: a probe that fails was sent too
            result = prober.probe()
            if result.outcome == ProbeOutcome.OK:
                return (Verification(VerifyOutcome.IDLE_OK, f"{_work(last)}; probe answered in {result.seconds:.2f} s", 0.0),
                        Verdict.IDLE)
            if result.rejected:
                return Verification(VerifyOutcome.UNKNOWN, f"{_work(last)}; {rejection_text(result)}", 0.0), Verdict.UNKNOWN
            failures.append(f"{result.outcome}" + (f": {result.detail}" if result.detail else ""))
            target = Target(url, read_timeout)
            try:
                again = observe(target)
            finally:
                target.close()
            if again.outcome != ReadResult.OK or again.reading is None or not again.reading.has_engine_metrics:
                break
            if again.reading.work > 0 or other_process(last, again.reading) or not may_probe_engine(again.reading):
                return (Verification(VerifyOutcome.UNKNOWN, f"probe {failures[-1]}; then the server changed "
                                     f"({_work(again.reading)})", again.reading.work), Verdict.UNKNOWN)
            if result.unanswered and not _any_progress(last, again.reading):
                # the unanswered probe may still be in the engine's queue (behind frozen gauges): a second
                # one would only join it; the engine not moving since is the second failure
                failures.append("no engine progress since, not probed again")
                break
        if len(failures) >= 2:
            return Verification(VerifyOutcome.DOWN, f"idle and the probe failed twice ({'; '.join(failures)})", 0.0), Verdict.DOWN
        return Verification(VerifyOutcome.UNKNOWN, f"idle, probe {failures[-1]}, then /metrics failed", 0.0), Verdict.UNKNOWN
    finally:
        prober.close()


def verify(
    url: str,
    *,
    readings: int = 2,
    interval: float = 5.0,
    read_timeout: float = 5.0,
    probe_timeout: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,     # spans and waits: never the wall clock (a step would cut them)
    model: str = "",
    api_key: str = "",
    stall_ceiling: float = DEFAULT_CEILING,
    on_probe: OnProbe | None = None,
    evidence: FrozenEvidence | None = None,
) -> Verification:
    """Fresh direct readings of one server, `interval` apart: may it be restarted? (see module doc)"""
    return _examine(url, readings, interval, read_timeout, probe_timeout, sleep, clock, True, model, api_key,
                    stall_ceiling, on_probe, evidence)[0]


EXIT_CODES = {
    Verdict.IDLE: 0, Verdict.BUSY: 0, Verdict.RESTARTED: 0,
    Verdict.NO_METRICS: 1, Verdict.UNKNOWN: 1,
    Verdict.STALLED: 2, Verdict.DOWN: 2, Verdict.SLEEPING: 0,
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the server itself, e.g. http://10.0.0.5:8000 (never a proxy)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between readings (default 5)")
    parser.add_argument("--readings", type=int, default=2, help="number of readings (default 2)")
    parser.add_argument("--timeout", type=float, default=5.0, help="/metrics timeout (default 5)")
    parser.add_argument("--probe-timeout", type=float, default=10.0, help="idle probe timeout (default 10)")
    parser.add_argument("--model", default="", help="model for the probe (default: first of /v1/models)")
    parser.add_argument("--no-probe", action="store_true", help="never send a generation request")
    parser.add_argument("--stall-after", type=float, default=120.0,
                        help="report stalled only when the readings span at least this many seconds without "
                             "engine progress (default 120, as the exporter); shorter evidence is UNKNOWN")
    parser.add_argument("--stall-ceiling", type=float, default=DEFAULT_CEILING,
                        help="the longest the readings are extended when the engine's own numbers say one step "
                             "can outlast them (frozen counters within one step prove nothing; default 900)")
    parser.add_argument("--api-key-file", default="", metavar="PATH",
                        help="file with the vLLM --api-key, sent as a bearer token on /v1/* only")


def run(args: argparse.Namespace) -> int:
    if args.readings < 1 or args.interval < 0 or args.timeout <= 0 or args.probe_timeout <= 0 or args.stall_after < 0:
        raise ConfigError("--readings must be >= 1, --interval >= 0, timeouts > 0, --stall-after >= 0")
    url = _check_url(args.url, "url")
    api_key = load_api_key(args.api_key_file, "--api-key-file")
    result, verdict = _examine(url, args.readings, args.interval, args.timeout, args.probe_timeout,
                               time.sleep, time.monotonic, not args.no_probe, args.model, api_key, args.stall_ceiling)
    span = (args.readings - 1) * args.interval
    if verdict is Verdict.STALLED and span < args.stall_after:
        # principle 4: frozen counters over a few seconds prove nothing (a long prefill step, a JIT)
        verdict = Verdict.UNKNOWN
        result = Verification(VerifyOutcome.UNKNOWN, f"{result.reason}; stalled needs {args.stall_after:g} s without progress "
                              f"(--stall-after): take readings spanning it, e.g. --readings "
                              f"{int(args.stall_after // max(args.interval, 1)) + 1} --interval "
                              f"{max(args.interval, 1):g}", result.in_flight)
    code = EXIT_CODES[verdict]
    label = {0: "OK", 1: "UNKNOWN", 2: "CRITICAL"}[code]
    shown = result.outcome if result.outcome == VerifyOutcome.UNRESPONSIVE else verdict.value
    print(redact(f"{label}: {shown} - {result.reason}"))
    sys.stdout.flush()
    return code
