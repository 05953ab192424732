"""The verdict: pure. `judge(previous state, observation, now, settings) -> new state`.

No I/O and no clock of its own: everything it knows arrives in the `Observation`, and time is the
`now` argument. See docs/design.md §3 for the names and codes shared with rules and dashboards.

* busy       work present and the engine moved since the previous reading (union of counters + KV gauge)
* sleeping   the engine says it sleeps on purpose (vLLM sleep mode: engine_sleep_state awake = 0; llama.cpp
             /props is_sleeping): never probed, never stalled or down for it; waking up is not a restart
* stalled    work present, no progress in >= `stall_readings` consecutive readings AND for longer than the
             engine's own steps can explain (exporter/steptime.py: stall_after is the floor);
             or work last seen and nothing answering: on vLLM/SGLang /metrics and /health both timing out
             for stall_after (a slow /metrics alone, /health fine, is unknown: normal under load); on
             llama.cpp /metrics timing out for stall_after since the last progress (the page is loop work)
* idle       no work present (only now may the exporter probe)
* restarted  another process answered (start time / *_created changed, or a counter went backwards)
* down       refused / errors / an idle backend failing its probe, `down_after` times in a row
             (a probe failure is refused, timeout, 5xx or a broken answer; a /metrics timeout after an
             idle reading counts only when /health fails too)
             On llama.cpp /metrics is a task of the inference loop: a /metrics timeout after an idle
             reading with /health fine is a stuck loop, stalled after stall_after (page_is_work_queue)
* no_metrics /metrics 404 or without engine series; judged by cheap endpoints only
* unknown    not enough readings yet, or data missing (never "healthy", never "stalled"); also an
             idle backend whose probe was rejected (HTTP 4xx: a misconfigured probe, not a failed server)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from llm_health.exporter.observation import Observation, ProbeOutcome, ReadResult, rejection_text
from llm_health.exporter.reading import EngineReading, Reading, Sleep, rate_text, rates
from llm_health.exporter.steptime import QuietBound, quiet_bound


class Verdict(StrEnum):
    UNKNOWN = "unknown"
    IDLE = "idle"
    BUSY = "busy"
    RESTARTED = "restarted"
    NO_METRICS = "no_metrics"
    STALLED = "stalled"
    DOWN = "down"
    SLEEPING = "sleeping"

    @property
    def code(self) -> int:
        return CODES[self]


CODES: dict[Verdict, int] = {
    Verdict.UNKNOWN: 0,
    Verdict.IDLE: 1,
    Verdict.BUSY: 2,
    Verdict.RESTARTED: 3,
    Verdict.NO_METRICS: 4,
    Verdict.STALLED: 5,
    Verdict.DOWN: 6,
    Verdict.SLEEPING: 7,
}

@dataclass(frozen=True)
class Thresholds:
    stall_after: float = 120.0
    down_after: int = 2
    stall_readings: int = 2   # consecutive no-progress readings (each compared with its predecessor)
    stall_ceiling: float = 900.0  # the most a step-derived stall bound may be (exporter/steptime.py)
    stall_floor: float = 30.0     # the least bound when the engine's numbers bound its steps (exporter/steptime.py)

    @classmethod
    def from_settings(cls, settings: Any) -> Thresholds:
        """From ExporterSettings (or anything with stall_after / down_after [/ stall_ceiling, stall_floor])."""
        return cls(stall_after=float(settings.stall_after), down_after=max(1, int(settings.down_after)),
                   stall_ceiling=float(getattr(settings, "stall_ceiling", 900.0)),
                   stall_floor=float(getattr(settings, "stall_floor", 30.0)))

    def bound(self, reading: Reading | None, learned: float, watched_gap: float | None = None,
              before: tuple[tuple[float, float, float], ...] = ()) -> QuietBound:
        return quiet_bound(reading, learned, self.stall_after, self.stall_ceiling, self.stall_floor, watched_gap,
                           before)


@dataclass(frozen=True)
class EngineTrack:
    stuck_since: float | None = None      # since when its counters are frozen with work present
    frozen_readings: int = 0              # consecutive readings without progress, with work present


@dataclass(frozen=True)
class BackendState:
    verdict: Verdict = Verdict.UNKNOWN
    reason: str = "no reading yet"
    since: float = 0.0                    # when this verdict began
    last: Reading | None = None           # previous good reading (same process as the next, hopefully)
    last_at: float | None = None          # when `last` was taken
    last_seen: float | None = None        # the latest moment `last`'s counters may be from: its answer's
                                          # arrival when that was slow (Observation.answered), else last_at
    engines: dict[str, EngineTrack] = field(default_factory=dict)
    failures: int = 0                     # consecutive failed readings / failed probes of an idle backend
    silent_since: float | None = None     # first of consecutive /metrics timeouts with work last seen and
                                          # /health failing too (vLLM, SGLang: the server answers nothing)
    last_progress: float | None = None    # clock time of the last observed engine progress
    in_flight: float = 0.0
    tokens_per_second: float = 0.0        # generation-token counter rate (llama.cpp: credited at completion)
    steps_per_second: float = 0.0         # engine-step counter rate (V1 iterations, SGLang passes, llama.cpp decodes)
    probe_failures: int = 0
    probe_rejected: str = ""              # the last probe was rejected (4xx): idle is "unknown" until one answers
    longest_quiet: float = 0.0            # longest pause with work seen end in progress, on this process
    steps_moved: float | None = None      # engine steps between the last two readings (None: not comparable)
    stall_bound: float = 0.0              # the stall bound that applied at the last reading (0: none yet)
    probe_unanswered: bool = False        # the last probe timed out and the engine has not moved since: it may
    #                                       still sit in the engine's queue, so no new probe until it moves
    watched_gap: float | None = None      # the longest gap between this process's good readings since its first
    watch_before: tuple[tuple[float, float, float], ...] = ()   # its step buckets at that first reading


def _work_text(r: Reading | EngineReading) -> str:
    return f"{r.running:g} running, {r.waiting:g} waiting"


def progressed(old: EngineReading, new: EngineReading) -> bool:
    for name, value in new.counters.items():
        before = old.counters.get(name)
        if before is not None and value > before:
            return True
    return old.kv_usage is not None and new.kv_usage is not None and new.kv_usage != old.kv_usage


def progress_signature(reading: Reading) -> str:
    """What `progressed()` compares, as one short string: two readings of one process with the same
    signature show no engine progress between them (counters only grow; the KV gauge is in it too). The
    exporter publishes it for a stalled backend (/verdicts), so a verification can tell from one fresh
    reading that the counters are still the ones the exporter saw frozen (exporter/check.py)."""
    parts = [f"p={reading.process_start!r};h={reading.start_header!r}"]
    for key in sorted(reading.engines):
        eng = reading.engines[key]
        counters = ",".join(f"{n}={v!r}" for n, v in sorted(eng.counters.items()))
        parts.append(f"{key}:{counters};kv={eng.kv_usage!r}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def other_process(old: Reading, new: Reading) -> str:
    """Why `new` comes from another process than `old` ("" when it does not)."""
    if old.process_start is not None and new.process_start is not None:
        if abs(new.process_start - old.process_start) > 1e-3:
            return "process start time changed"
    if old.start_header is not None and new.start_header is not None and new.start_header != old.start_header:
        return "Process-Start-Time-Unix header changed"
    for name, value in new.server.items():
        before = old.server.get(name)
        if before is not None and value < before:
            return f"counter {name} went backwards ({before:g} -> {value:g})"
    for key, value in new.created.items():
        before = old.created.get(key)
        if before is not None and abs(before - value) > 1e-3:
            return f"{key.split('{', 1)[0]} changed"
    for engine, eng in new.engines.items():
        prev = old.engines.get(engine)
        if prev is None:
            continue
        for name, value in eng.counters.items():
            before = prev.counters.get(name)
            if before is not None and value < before:
                return f"counter {name} went backwards ({before:g} -> {value:g})"
    if old.flavour != new.flavour and "none" not in (old.flavour, new.flavour):
        return f"engine flavour changed ({old.flavour} -> {new.flavour})"
    return ""


def _become(prev: BackendState, verdict: Verdict, reason: str, now: float, **changes: Any) -> BackendState:
    since = prev.since if prev.verdict == verdict else now
    return replace(prev, verdict=verdict, reason=reason, since=since, **changes)


def judge(prev: BackendState | None, obs: Observation, now: float, settings: Thresholds | Any) -> BackendState:
    """The new state of one backend after one observation at time `now`.

    `settings`: Thresholds, or ExporterSettings (anything with stall_after and down_after).
    """
    if not isinstance(settings, Thresholds):
        settings = Thresholds.from_settings(settings)
    if prev is None:
        prev = BackendState(since=now)
    if obs.outcome == ReadResult.OK and obs.reading is not None and obs.reading.has_engine_metrics:
        return _judge_reading(prev, obs, obs.reading, now, settings)
    if obs.outcome in (ReadResult.OK, ReadResult.NOT_FOUND):
        return _judge_no_metrics(prev, obs, now, settings)
    if obs.outcome == ReadResult.TIMEOUT:
        return _judge_timeout(prev, obs, now, settings)
    return _judge_failure(prev, obs, now, settings)


def _failed(prev: BackendState, what: str, now: float, settings: Thresholds, **changes: Any) -> BackendState:
    failures = prev.failures + 1
    if failures >= settings.down_after:
        return _become(prev, Verdict.DOWN, f"{what} ({failures} in a row)", now,
                       failures=failures, in_flight=0.0, tokens_per_second=0.0, steps_per_second=0.0, **changes)
    return _become(prev, Verdict.UNKNOWN, f"{what} ({failures} of {settings.down_after} before down)", now,
                   failures=failures, in_flight=0.0, tokens_per_second=0.0, steps_per_second=0.0, **changes)


def _judge_failure(prev: BackendState, obs: Observation, now: float, settings: Thresholds) -> BackendState:
    what = {"refused": "connection refused"}.get(obs.outcome, "/metrics error")
    if obs.detail and obs.detail != what:
        what = f"{what}: {obs.detail}"
    return _failed(prev, what, now, settings, silent_since=None)


def _judge_timeout(prev: BackendState, obs: Observation, now: float, settings: Thresholds) -> BackendState:
    """A /metrics timeout. After a reading with work: on llama.cpp the hanging page is the inference
    loop's own work (evidence, toward stalled); on vLLM and SGLang the page comes from the API server's
    event loop, merely slow under load: unknown while /health answers (principle 3: missing data is
    never "stalled"), toward stalled only while /health fails too (the server answers nothing)."""
    last = prev.last
    if last is not None and last.work <= 0 and page_is_work_queue(last) and obs.cheap_ok is not False:
        return _judge_queue_hang(prev, last, now, settings)
    if last is None or last.work <= 0:
        # no work at the last reading: slow only counts toward down when /health fails too
        if obs.cheap_ok is True:
            return _become(prev, Verdict.UNKNOWN, "/metrics slow, /health fine", now, failures=0,
                           silent_since=None, in_flight=0.0, tokens_per_second=0.0, steps_per_second=0.0)
        what = "/metrics timed out" + ("; /health failed too" if obs.cheap_ok is False else "")
        return _failed(prev, what, now, settings, silent_since=None)
    if page_is_work_queue(last):
        # the last moment the engine was known to move: the last good reading, or the start of its freeze
        stuck = [t.stuck_since for t in prev.engines.values() if t.stuck_since is not None]
        return _timeouts_toward_stall(
            prev, now, settings, min(stuck) if stuck else None,
            lambda failures, quiet: (f"/metrics timed out {failures} time(s) in a row; last reading "
                                     f"{_work_text(last)}; no progress seen for {quiet:.0f} s"),
            bound=settings.bound(last, 0.0), tokens_per_second=0.0, steps_per_second=0.0)
    if obs.cheap_ok is not False:
        failures = prev.failures + 1
        health = "/health fine" if obs.cheap_ok else "/health not asked"
        return _become(prev, Verdict.UNKNOWN,
                       f"/metrics timed out {failures} time(s) in a row, {health}: a slow page under load is "
                       f"no evidence of a stall; last reading {_work_text(last)}", now, failures=failures,
                       silent_since=None, tokens_per_second=0.0, steps_per_second=0.0)
    silent_since = prev.silent_since if prev.silent_since is not None else now
    return _timeouts_toward_stall(
        prev, now, settings, silent_since,
        lambda failures, quiet: (f"/metrics and /health timed out, nothing answered for {quiet:.0f} s "
                                 f"({failures} reading(s) in a row); last reading {_work_text(last)}"),
        tokens_per_second=0.0, steps_per_second=0.0, silent_since=silent_since)


def _timeouts_toward_stall(prev: BackendState, now: float, settings: Thresholds, anchor: float | None,
                           text: Callable[[int, float], str], bound: QuietBound | None = None,
                           **cols: Any) -> BackendState:
    """One more /metrics timeout that counts as evidence of a stall: stalled once `stall_readings`
    timeouts in a row span the bound since `anchor` (default: the last good reading), else unknown.
    `bound`: llama.cpp's page is answered by its inference loop between two `llama_decode` calls, so it
    hangs for as long as one step takes: the bound its last reading's own numbers give (its context at its
    prompt speed; not a pause this exporter saw end, which after a thawed stall would only delay the next
    one) applies (a 30 s prompt step is no stall). Without one (vLLM's and SGLang's API servers answer during
    their steps, so a server that answers nothing is no step): `stall_after`. `text(failures, quiet)` says
    what was seen; `cols` are the state fields to set."""
    if anchor is None:
        anchor = _last_seen(prev, now)
    if bound is None:
        bound = QuietBound(settings.stall_after, f"stall_after {settings.stall_after:g} s")
    quiet = now - anchor
    failures = prev.failures + 1
    said = text(failures, quiet)
    if failures >= settings.stall_readings and quiet >= bound.seconds:
        return _become(prev, Verdict.STALLED, f"{said} (bound: {bound.why})", now, failures=failures,
                       stall_bound=bound.seconds, **cols)
    return _become(prev, Verdict.UNKNOWN, said + f" (stalled after {bound.seconds:.0f} s: {bound.why})", now,
                   failures=failures, stall_bound=bound.seconds, **cols)


PROBE_STEPS = 3   # engine steps one max_tokens = 1 probe may take (its prompt's chunk(s) and the token)


def idle_believable(state: BackendState, obs: Observation) -> bool:
    """Is the page's "no work" believable? Not when the engine's step counter moved since the previous
    reading by more than our own probe (finished since then) explains: SGLang writes its running/queued
    gauges at prefill batches and every 40 decode steps, so work given to an idle SGLang reads 0 / 0 for
    seconds while its forward passes move (verified on SGLang 0.5.23). An engine that just stepped was
    alive anyway: a probe would prove nothing more and could meet work.

    Nor on the reading that shows another process answering (a restart): a server that has just come back
    is when the clients' retries and the balancer's re-admission land, after its page was rendered; the
    next reading of the new process probes it if it is still idle."""
    if state.verdict is Verdict.RESTARTED and state.watched_gap == 0.0:
        return False
    moved = state.steps_moved
    if moved is None:
        return True
    return moved <= (PROBE_STEPS if obs.probe is not None else 0)


def may_probe_engine(reading: Reading) -> bool:
    """Whether the engine's own state allows a generation request (the caller checks there is no work):
    never while it sleeps (a completion can crash a sleeping vLLM and wakes a sleeping llama.cpp, a
    model load), and on llama.cpp only once /props said it is awake (its page cannot say)."""
    if reading.asleep or reading.sleep is Sleep.PARTLY:
        return False
    return reading.flavour != "llamacpp" or reading.sleep is Sleep.AWAKE


def page_is_work_queue(last: Reading) -> bool:
    """Is /metrics answered by the engine's own inference loop (a task in its queue)?

    llama.cpp's `llama-server` posts every /metrics request to the loop that runs the model and waits
    for it without a timeout, while /health answers from the HTTP thread. There a page that does not
    come back is the engine not serving its queue, whatever the previous reading showed. vLLM and
    SGLang answer /metrics from the API server's event loop, which is merely slow under load.
    """
    return last.flavour == "llamacpp"


def _judge_queue_hang(prev: BackendState, last: Reading, now: float, settings: Thresholds) -> BackendState:
    """llama.cpp: /metrics hangs after an idle reading while /health answers: the loop is stuck.

    Judged like frozen counters with work present (the hanging page is itself work, and a request that
    came after the idle reading may be in one long prompt step): stalled once `stall_readings` timeouts in
    a row span the step-derived bound of the last reading since that reading. Never "down": the process
    answers.
    """
    return _timeouts_toward_stall(
        prev, now, settings, None,
        lambda failures, quiet: (f"/metrics (served by the inference loop) timed out {failures} time(s) in a "
                                 f"row after an idle reading, /health fine: the loop has not served its queue "
                                 f"for {quiet:.0f} s"),
        bound=settings.bound(last, 0.0), in_flight=0.0, tokens_per_second=0.0)


def _judge_no_metrics(prev: BackendState, obs: Observation, now: float, settings: Thresholds) -> BackendState:
    page = "/metrics not found" if obs.outcome == ReadResult.NOT_FOUND else "/metrics has no engine series"
    if obs.cheap_ok is False:
        return _failed(prev, f"{page}; /health and /v1/models fail", now, settings, silent_since=None)
    cheap = "; /health or /v1/models answered" if obs.cheap_ok else ""
    return _become(prev, Verdict.NO_METRICS, page + cheap, now, failures=0, silent_since=None,
                   in_flight=0.0, tokens_per_second=0.0, steps_per_second=0.0, probe_failures=0)


def _last_seen(prev: BackendState, now: float) -> float:
    """The latest moment the previous good reading's counters may be from (`now` without one)."""
    if prev.last_seen is not None:
        return prev.last_seen
    return prev.last_at if prev.last_at is not None else now


def _watch_anew(base: dict[str, Any], reading: Reading, now: float) -> dict[str, EngineTrack]:
    """A process read for the first time (the first reading, or another process answered): its watch starts
    here (no gap seen yet, its step buckets as they are, no probe of ours in its queue) and its engines'
    tracks afresh."""
    base["watched_gap"], base["watch_before"] = 0.0, reading.step_buckets
    base["probe_unanswered"] = False
    return {e: EngineTrack(stuck_since=now if r.work > 0 else None) for e, r in reading.engines.items()}


def _judge_reading(
    prev: BackendState, obs: Observation, reading: Reading, now: float, settings: Thresholds
) -> BackendState:
    # a frozen clock starts no earlier than these counters may be from: a slow answer's arrival (a page
    # read at 21.6 s and answered at 23.5 s may show the counters of 23.5 s; an engine stopped right after
    # has been frozen since 23.5 s, not 21.6 s)
    seen = now if obs.answered is None else max(now, obs.answered)
    base: dict[str, Any] = {"failures": 0, "silent_since": None, "last": reading, "last_at": now,
                            "last_seen": seen, "in_flight": reading.work, "steps_moved": None}
    last = prev.last
    if last is None or not last.has_engine_metrics:
        tracks = _watch_anew(base, reading, seen)
        if reading.asleep:
            return _asleep(prev, reading, now, tokens_per_second=0.0, steps_per_second=0.0, **base)
        if reading.work <= 0:
            return _idle(prev, obs, now, settings, engines=tracks, tokens_per_second=0.0, steps_per_second=0.0, **base)
        return _become(prev, Verdict.UNKNOWN, f"first reading: {_work_text(reading)}", now,
                       engines=tracks, tokens_per_second=0.0, steps_per_second=0.0, probe_failures=0,
                       stall_bound=settings.bound(reading, 0.0).seconds, **base)
    changed = other_process(last, reading)
    if changed:
        tracks = _watch_anew(base, reading, seen)
        return _become(prev, Verdict.RESTARTED, f"another process answered: {changed}; {_work_text(reading)}",
                       now, engines=tracks, tokens_per_second=0.0, steps_per_second=0.0, probe_failures=0,
                       longest_quiet=0.0, **base)
    if reading.asleep:
        elapsed = max(now - (prev.last_at if prev.last_at is not None else now), 1e-9)
        tps, sps = rates(last, reading, elapsed)
        return _asleep(prev, reading, now, tokens_per_second=tps, steps_per_second=sps, **base)

    elapsed = max(now - (prev.last_at if prev.last_at is not None else now), 1e-9)
    watched = None if prev.watched_gap is None else max(prev.watched_gap, elapsed)
    base["watched_gap"] = watched
    tps, sps = rates(last, reading, elapsed)
    steps_now, steps_before = reading.steps(), last.steps()
    base["steps_moved"] = steps_now - steps_before if steps_now is not None and steps_before is not None else None
    tracks: dict[str, EngineTrack] = {}
    any_progress = False
    worst: tuple[str, EngineReading, EngineTrack] | None = None   # the engine closest to stalled
    busy_engines = 0
    blind: list[str] = []                          # engines with work and no progress series at all
    learned = prev.longest_quiet
    for key, eng in reading.engines.items():
        old = last.engines.get(key)
        track = prev.engines.get(key, EngineTrack())
        moved = old is not None and progressed(old, eng)
        any_progress = any_progress or moved
        if moved and track.stuck_since is not None:
            learned = max(learned, seen - track.stuck_since)  # a pause with work that ended in progress
        if eng.work <= 0:
            tracks[key] = EngineTrack()
            continue
        if not eng.counters and eng.kv_usage is None:
            # work, and nothing on the page that could ever show progress (a page cut after its gauges,
            # counters renamed, another exporter's gauges): not judged, never stalled for it
            tracks[key] = EngineTrack()
            blind.append(key)
            continue
        if moved:
            tracks[key] = EngineTrack()
            busy_engines += 1
            continue
        if old is None:
            tracks[key] = EngineTrack(stuck_since=seen)
        else:
            stuck_since = track.stuck_since
            if stuck_since is None:
                # counters as they are were last seen at the previous reading (if it had work), else now
                stuck_since = _last_seen(prev, now) if old.work > 0 else seen
            tracks[key] = EngineTrack(stuck_since=stuck_since, frozen_readings=track.frozen_readings + 1)
        t = tracks[key]
        since = now if t.stuck_since is None else t.stuck_since
        if worst is None or since < (now if worst[2].stuck_since is None else worst[2].stuck_since):
            worst = (key, eng, t)
    last_progress = seen if any_progress else prev.last_progress
    base["probe_unanswered"] = prev.probe_unanswered and not any_progress
    bound = settings.bound(reading, learned, watched, prev.watch_before)
    base.update(engines=tracks, tokens_per_second=tps, steps_per_second=sps, last_progress=last_progress,
                longest_quiet=learned, stall_bound=bound.seconds)
    multi = len(reading.engines) > 1

    if worst is not None:
        key, eng, t = worst
        quiet = max(0.0, now - (t.stuck_since if t.stuck_since is not None else now))
        prefix = f"engine {key}: " if multi else ""
        text = f"{prefix}{_work_text(eng)}, no engine progress for {quiet:.0f} s"
        if t.frozen_readings >= settings.stall_readings and quiet >= bound.seconds:
            return _become(prev, Verdict.STALLED, f"{text} (bound: {bound.why})", now, probe_failures=0, **base)
        if busy_engines == 0:
            return _become(prev, Verdict.UNKNOWN, f"{text} (stalled after {bound.seconds:.0f} s: {bound.why})",
                           now, probe_failures=0, **base)
    if blind and busy_engines == 0:
        which = f"engine {', '.join(blind)}: " if multi else ""
        return _become(prev, Verdict.UNKNOWN, f"{which}{_work_text(reading)}, and no progress series on the page "
                       "(no token or request counter, no KV gauge): progress cannot be told", now, probe_failures=0,
                       **base)
    if busy_engines > 0:
        return _become(prev, Verdict.BUSY,
                       f"{_work_text(reading)}, engine progressing ({rate_text(reading, tps, sps)})",
                       now, probe_failures=0, **base)
    return _idle(prev, obs, now, settings, **base)


def _asleep(prev: BackendState, reading: Reading, now: float, **changes: Any) -> BackendState:
    """The engine sleeps on purpose: never probed (a completion request can crash a sleeping vLLM, and
    wakes a sleeping llama.cpp), never stalled or down for it; its stall clock does not run."""
    level = {"weights_offloaded": " (level 1: weights offloaded)", "discard_all": " (level 2: weights discarded)"}
    text = f"asleep{level.get(reading.sleep.value, '')}: not probed"
    if reading.work > 0:
        text += f"; {_work_text(reading)} (they wait for it to wake)"
    changes.update(engines={e: EngineTrack() for e in reading.engines}, failures=0, probe_failures=0,
                   probe_rejected="")
    return _become(prev, Verdict.SLEEPING, text, now, **changes)


def _idle(prev: BackendState, obs: Observation, now: float, settings: Thresholds, **changes: Any) -> BackendState:
    reading: Reading = changes["last"]
    text = f"{_work_text(reading)}"
    probe = obs.probe
    if probe is not None and probe.rejected:
        # a misconfigured probe (API key, model): says nothing about the server, never counts toward down
        return _become(prev, Verdict.UNKNOWN, f"{text}; {rejection_text(probe)}", now,
                       probe_rejected=rejection_text(probe), **changes)
    if probe is None:
        if prev.probe_rejected and prev.verdict != Verdict.RESTARTED:
            return _become(prev, Verdict.UNKNOWN, f"{text}; last {prev.probe_rejected}", now, **changes)
        if prev.verdict == Verdict.RESTARTED:
            # another process answered and is idle: it stays "restarted" until it answers a probe
            return _become(prev, Verdict.RESTARTED, prev.reason.split("; now ")[0] + f"; now {text}, "
                           "awaiting the probe's answer", now, **changes)
        if changes.get("probe_unanswered") and prev.probe_failures < settings.down_after:
            # not probed again (the timed-out probe may still be in the engine's queue, invisible behind
            # frozen gauges): the engine not moving since is the next failure
            failures = prev.probe_failures + 1
            detail = "the probe that timed out is still unanswered: no engine progress since, not probed again"
            if failures >= settings.down_after:
                changes["in_flight"] = 0.0
                return _become(prev, Verdict.DOWN, f"idle and {detail} ({failures} in a row)", now,
                               probe_failures=failures, **changes)
            return _become(prev, Verdict.IDLE, f"{text}; {detail} ({failures} of {settings.down_after} before "
                           "down)", now, probe_failures=failures, **changes)
        if prev.probe_failures >= settings.down_after:
            # the page says idle, but the server did not answer: a stalled engine's gauges are frozen,
            # so "idle" proves nothing here. It stays down until a probe answers (or the engine moves).
            changes["in_flight"] = 0.0
            return _become(prev, Verdict.DOWN, f"{text} on a frozen page; the last {prev.probe_failures} probes "
                           "failed, down until a probe answers", now, **changes)
        if prev.probe_failures:
            text += f"; last probe failed ({prev.probe_failures} of {settings.down_after})"
        return _become(prev, Verdict.IDLE, text, now, **changes)
    if probe.outcome == ProbeOutcome.OK:
        changes["probe_unanswered"] = False
        return _become(prev, Verdict.IDLE, f"{text}; probe answered in {probe.seconds:.2f} s", now,
                       probe_failures=0, probe_rejected="", **changes)
    failures = prev.probe_failures + 1
    detail = f"probe {probe.outcome}" + (f": {probe.detail}" if probe.detail else "")
    changes["probe_unanswered"] = probe.unanswered
    if failures >= settings.down_after:
        changes["in_flight"] = 0.0
        return _become(prev, Verdict.DOWN, f"idle and {detail} ({failures} in a row)", now,
                       probe_failures=failures, probe_rejected="", **changes)
    return _become(prev, Verdict.IDLE, f"{text}; {detail} ({failures} of {settings.down_after} before down)",
                   now, probe_failures=failures, probe_rejected="", **changes)
