"""Samples -> `Reading`: what one /metrics page says about a server's engines and its process.

Per engine (vLLM's `engine` label, SGLang's `dp_rank`, else "0"): running, waiting, KV usage and
the progress counters, i.e. the series that move only when the engine steps. Counters with extra
labels (`finished_reason`, `model_name`, `mode`) are summed per engine.

Process identity: `process_start_time_seconds` and the `*_created` series (V1 single process), and
llama-server's `Process-Start-Time-Unix` response header (passed in by the caller). Multiprocess
pages (and SGLang's, always) have none of these; there a counter going backwards is the restart
signal (checked in `verdict.py`, which owns the comparison of two readings).

Flavours (docs/design.md "Series per engine"):
* `v0`, `v1` (vLLM). V0 observes `iteration_tokens_total` with a 0 every 10 s while idle, so its
  `_count` is a progress signal on V1 only.
* `sglang`: scheduler series per rank; only `tp_rank="0"`, `pp_rank="0"` is read (every TP rank
  exports the same), the engine key is `dp_rank`. Tokenizer-side counters (`generation_tokens`,
  `prompt_tokens`, no rank labels) are server-wide: `Reading.server`; an engine without counters of
  its own is judged by them (so with several DP ranks and no per-rank counter, one wedged rank is
  hidden by the others' progress). With a single rank they count as its own. They are credited when a
  request finishes (verified on 0.5.23): tokens/s come from the per-rank
  `sglang:realtime_tokens_total{mode="decode"}` (every decode step) where every rank has it.
* `llamacpp`: progress from `n_decode_total` (one per engine step); `tokens_predicted_total` moves
  only when a request finishes (still evidence of progress, never a rate); in flight =
  `requests_processing` + `requests_deferred`; `kv_cache_usage_ratio` is optional (gone in b11434).

Steps per second come from the step counters (`STEP_COUNTERS`): vLLM V1's iteration count, SGLang's
forward passes, llama.cpp's decode calls.

How long one engine step can take (`Reading.step_seconds`, exporter/steptime.py turns it into the stall
bound): the upper bound of the highest bucket with observations of the engine's own latency histograms
(vLLM's inter-token latency and request prefill time, SGLang's inter-token latency); llama.cpp's prompt
seconds per token (`prompt_seconds_total / prompt_tokens_total`) and its largest sequence seen
(`n_tokens_max`); its context size comes from `/props` (`EngineProps`, asked by the I/O layer).

Sleep (`Reading.sleep`): vLLM's `vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|
"discard_all"}` (>= 0.11); an engine is asleep when `awake` is 0 (the level is the state at 1). llama.cpp's
page says nothing: `/props` `is_sleeping` does (`--sleep-idle-seconds`), merged by `with_props()`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from math import isfinite
from typing import Any

from llm_health.exporter.fastparse import Names, parse_fast
from llm_health.exporter.parser import Page, Sample

V0_HELP = "currently running on GPU"
V1_HELP = "in model execution batches"

# progress counters: wire name -> short name (shared across flavours where the meaning matches)
VLLM_COUNTERS = {
    "vllm:iteration_tokens_total_sum": "iteration_tokens_sum",
    "vllm:iteration_tokens_total_count": "iteration_count",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:request_success_total": "finished_requests",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries_total": "gpu_prefix_cache_queries",
}
#: a page with more engines than this is refused (an error, not a reading): real servers have a few (data
#: parallel ranks); a page inventing 300 000 engine labels took judge() 1.7 s on the scheduler's thread
MAX_ENGINES = 512

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

SGLANG_COUNTERS = {
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:cuda_graph_passes_total": "forward_passes",
    "sglang:cached_tokens_total": "cached_tokens",
}
# per rank, every decode step (0.5.23; its HELP says "per log interval", not so for mode="decode"): the
# tokens/s source, as the tokenizer's generation_tokens_total is credited only when a request finishes
SGLANG_DECODE_TOKENS = "sglang:realtime_tokens_total"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = ("sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs")
SGLANG_KV = ("sglang:token_usage",)

LLAMACPP_COUNTERS = {
    "llamacpp:n_decode_total": "decode_calls",
    "llamacpp:tokens_predicted_total": "generation_tokens",
    "llamacpp:prompt_tokens_total": "prompt_tokens",
}
LLAMACPP_RUNNING = "llamacpp:requests_processing"
LLAMACPP_WAITING = ("llamacpp:requests_deferred",)
LLAMACPP_KV = ("llamacpp:kv_cache_usage_ratio",)  # optional: removed upstream (absent in b11434)
LLAMACPP_PROMPT_SECONDS = "llamacpp:prompt_seconds_total"
LLAMACPP_TOKENS_MAX = "llamacpp:n_tokens_max"
VLLM_SLEEP = "vllm:engine_sleep_state"
# latency histograms whose highest non-empty bucket bounds how long one engine step has taken
STEP_HISTOGRAMS = frozenset({
    "vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket",
    "sglang:inter_token_latency_seconds_bucket", "sglang:time_per_output_token_seconds_bucket",
})
STEP_COUNTERS = ("iteration_count", "forward_passes", "decode_calls")
SGLANG_RANK_LABELS = ("tp_rank", "pp_rank", "dp_rank")

PROCESS_START = "process_start_time_seconds"

WANTED: frozenset[str] = frozenset(
    {*VLLM_COUNTERS, VLLM_RUNNING, VLLM_WAITING, *VLLM_KV,
     *SGLANG_COUNTERS, SGLANG_DECODE_TOKENS, SGLANG_RUNNING, *SGLANG_WAITING, *SGLANG_KV,
     *LLAMACPP_COUNTERS, LLAMACPP_RUNNING, *LLAMACPP_WAITING, *LLAMACPP_KV, LLAMACPP_PROMPT_SECONDS,
     LLAMACPP_TOKENS_MAX, VLLM_SLEEP, *STEP_HISTOGRAMS, PROCESS_START}
)
ENGINE_PREFIXES = ("vllm", "sglang", "llamacpp")


# what a reading keeps: the names above and every vLLM `*_created` series (V1's process identity)
wanted = Names(WANTED, rules=(("vllm:", "_created"),))


class Sleep(StrEnum):
    """An engine's sleep state, as the engine itself reports it."""

    UNKNOWN = ""                          # the engine says nothing (older vLLM, SGLang, llama.cpp unasked)
    AWAKE = "awake"
    WEIGHTS_OFFLOADED = "weights_offloaded"   # vLLM sleep level 1
    DISCARD_ALL = "discard_all"               # vLLM sleep level 2
    ASLEEP = "asleep"                         # llama.cpp /props is_sleeping (--sleep-idle-seconds)
    PARTLY = "partly"                         # vLLM, several engines: some asleep, some awake (going to
                                              # sleep or waking): not asleep, never probed

    @property
    def asleep(self) -> bool:
        return self in (Sleep.WEIGHTS_OFFLOADED, Sleep.DISCARD_ALL, Sleep.ASLEEP)


@dataclass(frozen=True)
class EngineProps:
    """What llama.cpp's /props adds to its page (answered from the HTTP thread, also while asleep)."""

    sleeping: bool | None = None
    context_tokens: float | None = None   # n_ctx of a slot x total_slots: the most one step can be given


@dataclass
class EngineReading:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    shared: bool = False  # SGLang: `counters` are the server-wide ones (no counter of its own)

    @property
    def work(self) -> float:
        return self.running + self.waiting


@dataclass
class Reading:
    flavour: str                                  # v0 | v1 | sglang | llamacpp | none
    engines: dict[str, EngineReading]
    process_start: float | None = None
    created: dict[str, float] = field(default_factory=dict)  # series key -> creation time
    start_header: float | None = None             # llama-server's Process-Start-Time-Unix header
    server: dict[str, float] = field(default_factory=dict)   # SGLang tokenizer-side counters (all ranks)
    sleep: Sleep = Sleep.UNKNOWN
    step_seconds: float | None = None             # longest step the engine's own histograms have seen
    # their buckets that hold observations: (lower bound, upper bound, observations), over every step
    # histogram and its series (exporter/steptime.py rules out the ones an exporter saw were no single step)
    step_buckets: tuple[tuple[float, float, float], ...] = ()
    prompt_seconds_per_token: float | None = None  # llama.cpp: prompt_seconds_total / prompt_tokens_total
    prompt_timing: bool = False                   # llama.cpp: the page has prompt_seconds_total (b3xxx+)
    tokens_max: float | None = None               # llama.cpp: largest sequence seen (n_tokens_max)
    context_tokens: float | None = None           # llama.cpp: context of all slots (from /props)

    @property
    def asleep(self) -> bool:
        return self.sleep.asleep

    def with_props(self, props: EngineProps | None) -> Reading:
        """This reading with llama.cpp's /props answer merged in (sleep state, context size)."""
        if props is None:
            return self
        sleep = self.sleep if props.sleeping is None else (Sleep.ASLEEP if props.sleeping else Sleep.AWAKE)
        return replace(self, sleep=sleep, context_tokens=props.context_tokens or self.context_tokens)

    def to_json(self) -> str:
        """The whole reading as JSON (the remediator keeps a drain's starting reading in its store)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Reading:
        """`to_json()`'s text back; ValueError for anything else. Every field round-trips (a field added
        later and missing from older text takes its default)."""
        try:
            data = json.loads(text)
            known = {f.name for f in fields(cls)}
            kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
            kwargs["engines"] = {k: EngineReading(**v) for k, v in data["engines"].items()}
            kwargs["sleep"] = Sleep(kwargs.get("sleep", ""))
            kwargs["step_buckets"] = tuple((float(lo), float(hi), float(n))
                                           for lo, hi, n in kwargs.get("step_buckets", ()))
            return cls(**kwargs)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a reading: {exc}") from None

    @property
    def has_engine_metrics(self) -> bool:
        return bool(self.engines)

    @property
    def running(self) -> float:
        return sum(e.running for e in self.engines.values())

    @property
    def waiting(self) -> float:
        return sum(e.waiting for e in self.engines.values())

    @property
    def work(self) -> float:
        return self.running + self.waiting

    def generation_tokens(self) -> float:
        decoded = [e.counters["decode_tokens"] for e in self.engines.values() if "decode_tokens" in e.counters]
        if decoded and len(decoded) == len(self.engines):
            return sum(decoded)  # SGLang: tokens as they are decoded, per rank
        if "generation_tokens" in self.server:
            return self.server["generation_tokens"]
        return sum(e.counters.get("generation_tokens", 0.0) for e in self.engines.values())

    def steps(self) -> float | None:
        """Engine steps so far (all engines), or None when the page has no step counter."""
        values = [e.counters[name] for e in self.engines.values() if not e.shared
                  for name in STEP_COUNTERS if name in e.counters]
        return sum(values) if values else None

    @property
    def rate_unit(self) -> str:
        """What moves steadily on this engine: llama.cpp credits tokens only at completion."""
        return "decode steps/s" if self.flavour == "llamacpp" else "tokens/s"


def rates(old: Reading, new: Reading, seconds: float) -> tuple[float, float]:
    """(generation tokens/s, engine steps/s) from `old` to `new`, `seconds` apart (0 when unknown)."""
    dt = max(seconds, 1e-9)
    tps = max(new.generation_tokens() - old.generation_tokens(), 0.0) / dt
    steps_new, steps_old = new.steps(), old.steps()
    sps = max(steps_new - steps_old, 0.0) / dt if steps_new is not None and steps_old is not None else 0.0
    return tps, sps


def rate_text(reading: Reading, tps: float, sps: float) -> str:
    """"840 tokens/s", or on llama.cpp (tokens credited only at completion) "56 decode steps/s"."""
    if reading.rate_unit == "tokens/s":
        return f"{tps:.0f} tokens/s"
    return f"{sps:.0f} {reading.rate_unit}"


def _series_key(s: Sample) -> str:
    return s.name + "{" + ",".join(map("=".join, sorted(s.labels.items()))) + "}"


# the names from_page() reads apart from the per-engine series (a dict: one lookup per sample)
_STEP_BUCKET, _PROCESS_START, _SLEEP, _PROMPT_SECONDS, _TOKENS_MAX = range(5)
_SPECIAL = {PROCESS_START: _PROCESS_START, VLLM_SLEEP: _SLEEP, LLAMACPP_PROMPT_SECONDS: _PROMPT_SECONDS,
            LLAMACPP_TOKENS_MAX: _TOKENS_MAX, **dict.fromkeys(STEP_HISTOGRAMS, _STEP_BUCKET)}


def _flavour(page: Page, samples: list[Sample]) -> str:
    prefixes = page.prefixes
    if "vllm" in prefixes:
        help_text = page.helps.get(VLLM_RUNNING, "")
        if V0_HELP in help_text:
            return "v0"
        if V1_HELP in help_text:
            return "v1"
        for s in samples:
            if "engine" in s.labels or s.name == "vllm:kv_cache_usage_perc" or s.name.endswith("_created"):
                return "v1"
        return "v0"  # unknown vLLM version: the conservative choice (iteration _count not trusted)
    if "sglang" in prefixes:
        return "sglang"
    if "llamacpp" in prefixes:
        return "llamacpp"
    return "none"


SERVER = ""  # engine key of SGLang's server-wide (tokenizer-side) series


def _engine_of(flavour: str, labels: dict[str, str]) -> str | None:
    """Engine key of a sample, or None when the sample belongs to a replica we do not read."""
    if flavour == "sglang":
        if labels.get("tp_rank", "0") != "0" or labels.get("pp_rank", "0") != "0":
            return None
        if not any(k in labels for k in SGLANG_RANK_LABELS):
            return SERVER
        return labels.get("dp_rank", "0")
    return labels.get("engine", "0")


def from_page(page: Page, start_header: float | None = None) -> Reading:
    samples = page.samples
    flavour = _flavour(page, samples)
    if flavour == "v0" or flavour == "v1":
        counters, running, waiting, kvs = VLLM_COUNTERS, VLLM_RUNNING, (VLLM_WAITING,), VLLM_KV
    elif flavour == "sglang":
        counters, running, waiting, kvs = SGLANG_COUNTERS, SGLANG_RUNNING, SGLANG_WAITING, SGLANG_KV
    elif flavour == "llamacpp":
        counters, running, waiting, kvs = LLAMACPP_COUNTERS, LLAMACPP_RUNNING, LLAMACPP_WAITING, LLAMACPP_KV
    else:
        counters, running, waiting, kvs = {}, "", (), ()
    reading = Reading(flavour=flavour, engines={}, start_header=start_header)
    engines = reading.engines
    has_running = False
    unknowable = False                                  # a running or waiting gauge that is not a count
    buckets: dict[str, list[tuple[float, float]]] = {}   # histogram series -> (le, cumulative count)
    sleep: dict[str, dict[str, float]] = {}             # engine -> sleep_state -> value
    prompt_seconds: float | None = None
    sglang = flavour == "sglang"
    series_name, series_rest, series = "", None, None  # the last histogram series: its buckets come in a row
    for s in samples:
        name = s.name
        special = _SPECIAL.get(name)
        if special is not None:
            if special == _STEP_BUCKET:
                labels = s.labels
                le = labels.get("le")
                if le is None or (sglang and _engine_of(flavour, labels) is None):
                    continue
                try:
                    bound = float(le)
                except ValueError:
                    continue
                rest = labels.copy()
                del rest["le"]
                if series is None or name != series_name or rest != series_rest:
                    key = name + "{" + ",".join(map("=".join, sorted(rest.items())))
                    series, series_name, series_rest = buckets.setdefault(key, []), name, rest
                series.append((bound, s.value))
            elif special == _PROCESS_START:
                reading.process_start = s.value
            elif special == _SLEEP:
                state = s.labels.get("sleep_state", "")
                sleep.setdefault(s.labels.get("engine", "0"), {})[state] = s.value
            elif special == _PROMPT_SECONDS:
                prompt_seconds = s.value
            else:
                reading.tokens_max = s.value
            continue
        if name.endswith("_created"):
            reading.created[_series_key(s)] = s.value
            continue
        key = _engine_of(flavour, s.labels)
        if key is None:
            continue
        if not isfinite(s.value):
            # NaN never equals itself (a frozen counter or KV gauge would always look like progress) and a
            # NaN work gauge is no count at all: a page whose running or waiting is not a count says nothing
            # of its work, as a page without them
            if name == running or name in waiting:
                unknowable = True
            continue
        short = counters.get(name)
        if flavour == "sglang" and name == SGLANG_DECODE_TOKENS:
            short = "decode_tokens" if s.labels.get("mode") == "decode" else None
        if short is not None:
            if flavour == "v0" and short == "iteration_count":
                continue
            if key == SERVER:
                reading.server[short] = reading.server.get(short, 0.0) + s.value
                continue
            eng = engines.get(key)
            if eng is None:
                eng = engines[key] = EngineReading()
            eng.counters[short] = eng.counters.get(short, 0.0) + s.value
        elif name == running:
            has_running = True
            unknowable = unknowable or s.value < 0
            eng = engines.get(key) or engines.setdefault(key, EngineReading())
            eng.running += s.value
        elif name in waiting:
            unknowable = unknowable or s.value < 0
            eng = engines.get(key) or engines.setdefault(key, EngineReading())
            eng.waiting += s.value
        elif name in kvs:
            eng = engines.get(key) or engines.setdefault(key, EngineReading())
            if eng.kv_usage is None and s.value >= 0:
                eng.kv_usage = s.value
    engines.pop(SERVER, None)  # server-wide gauges (none known) do not make an engine
    if len(engines) > MAX_ENGINES:
        raise ValueError(f"{len(engines)} engines on one page (more than {MAX_ENGINES}): not judged")
    if reading.server:
        for eng in engines.values():
            if not eng.counters:
                eng.counters = dict(reading.server)
                eng.shared = True
            elif len(engines) == 1:  # one rank: the server-wide counters are its own too
                for name, value in reading.server.items():
                    eng.counters.setdefault(name, value)
    if not has_running or unknowable:
        # without a running-requests gauge (or with one that is no count) we cannot tell idle from busy:
        # treat as no engine metrics
        reading.engines = {}
    reading.step_buckets = _bucket_counts(buckets)
    # the upper bound of the highest bucket that holds an observation, over every step histogram (inf when
    # some observation lies beyond the largest finite bound); None when nothing was observed
    reading.step_seconds = max((hi for _, hi, _ in reading.step_buckets), default=None)
    reading.sleep = _sleep_state(sleep)
    if flavour == "llamacpp" and prompt_seconds is not None:
        reading.prompt_timing = True
        tokens = sum(e.counters.get("prompt_tokens", 0.0) for e in engines.values())
        if tokens > 0 and prompt_seconds > 0:
            reading.prompt_seconds_per_token = prompt_seconds / tokens
    return reading


def _bucket_counts(buckets: dict[str, list[tuple[float, float]]]) -> tuple[tuple[float, float, float], ...]:
    """(lower bound, upper bound, observations) of every bucket holding some, over every series (a bucket's
    lower bound is the bound before it in its own series; equal buckets of several series are summed)."""
    counts: dict[tuple[float, float], float] = {}
    for series in buckets.values():
        series.sort()
        below, low = 0.0, 0.0
        for bound, count in series:
            if count > below:
                counts[(low, bound)] = counts.get((low, bound), 0.0) + (count - below)
            below = max(below, count)
            low = bound
    return tuple((lo, hi, n) for (lo, hi), n in sorted(counts.items()))


def _sleep_state(states: dict[str, dict[str, float]]) -> Sleep:
    """Asleep only when every engine that reports the gauge says so (awake = 0); the deepest level wins.
    Some engines awake and others asleep is PARTLY (a probe could be routed to a sleeping one)."""
    if not states:
        return Sleep.UNKNOWN
    levels: list[Sleep] = []
    awake = 0
    for per_engine in states.values():
        if per_engine.get("awake", 1.0) != 0.0:
            awake += 1
        elif per_engine.get("discard_all", 0.0) == 1.0:
            levels.append(Sleep.DISCARD_ALL)
        elif per_engine.get("weights_offloaded", 0.0) == 1.0:
            levels.append(Sleep.WEIGHTS_OFFLOADED)
        else:
            return Sleep.UNKNOWN                  # awake = 0 and no level: not a state vLLM writes
    if awake:
        return Sleep.PARTLY if levels else Sleep.AWAKE
    return Sleep.DISCARD_ALL if Sleep.DISCARD_ALL in levels else Sleep.WEIGHTS_OFFLOADED


def read_text(text: str, start_header: str | None = None) -> Reading:
    """Exposition text -> Reading (the one call the exporter makes per backend and interval).
    `start_header`: llama-server's Process-Start-Time-Unix header, when the answer had one."""
    start: float | None = None
    if start_header:
        try:
            start = float(start_header)
        except ValueError:
            start = None
    return from_page(parse_fast(text, wanted, helps=(VLLM_RUNNING,)), start)
