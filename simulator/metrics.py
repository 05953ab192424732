"""The `/metrics` page of a simulated vLLM server, with vLLM's real names, types, HELP and labels.

Two engine flavours (see docs/reference/vllm-metrics-facts.md):
* `v1` (like 0.11+): labels `model_name` + `engine`, `vllm:kv_cache_usage_perc`,
  prefix-cache counters, `vllm:engine_sleep_state`, `*_created` series (single process).
* `v0` (like 0.6-0.7 with the in-process frontend): label `model_name` only,
  `vllm:gpu_cache_usage_perc`, `vllm:num_requests_swapped`, no `*_created`.
`v1` also has the API server's `http_requests_total{handler,method,status}` (prometheus-fastapi-
instrumentator, vLLM >= 0.8; status grouped "2xx"/"4xx"/"5xx", HTTP_EXCLUDED_HANDLERS not counted) when
the caller passes the counts (`render(..., http_requests=...)`; the server does, per process).
`multiprocess=True` drops `process_*`, `python_*` and `*_created` and orders the page like
prometheus_client's MultiProcessCollector (counters, gauges, histograms; `_sum` before buckets).

Two other engines (docs/reference/vllm-metrics-facts.md §5.1, docs/reference/llamacpp-facts.md):
* `sglang` (0.5.x): always multiprocess (no process_*, no _created, HELP "Multiprocess metric").
  Scheduler series carry `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank` (+ `dp_rank` with
  more than one engine) and are exported by every TP rank (`tp_size`); tokenizer-side counters and
  histograms carry no rank (one tokenizer for all DP ranks): `model_name`, `engine_type`, `is_streaming`
  (`cache_source` on cached tokens), as on the real 0.5.23 page (tests/fixtures/metrics/sglang-0.5.23-*).
* `llamacpp` (llama-server b11434): unlabelled `llamacpp:*` series with HELP and TYPE, no process_*,
  no _created, no kv_cache_* (removed upstream). Reading the page resets the throughput window.
"""

from __future__ import annotations

import gc
import os
import platform
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from llm_health.simulator.engine import Engine, Histogram

Labels = dict[str, str]


ENGINES = ("v0", "v1", "sglang", "llamacpp")
MULTIPROCESS_HELP = "Multiprocess metric"
# vLLM's Instrumentator(excluded_handlers=[...]) (vllm/entrypoints/openai/api_server.py, >= 0.8): regexes
# searched in the route path, so probes and scrapes never appear in http_requests_total
HTTP_EXCLUDED_HANDLERS = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
HTTP_REQUESTS_HELP = "Total number of requests by method, status and handler."

# (handler, method, grouped status) -> (count, creation time of the labelled child)
HttpCounts = Mapping[tuple[str, str, str], tuple[int, float]]


def http_handler(path: str, templated: bool) -> str | None:
    """The instrumentator's handler label of a request: the route's path, "none" for a path no route
    matches (should_group_untemplated), None when excluded (not counted)."""
    if any(pattern in path for pattern in HTTP_EXCLUDED_HANDLERS):
        return None
    return path if templated else "none"


def http_status(status: int) -> str:
    """should_group_status_codes: 200 -> "2xx", 404 -> "4xx", 500 -> "5xx"."""
    return f"{str(status)[0]}xx"


@dataclass(frozen=True)
class Flavour:
    engine: str = "v1"  # "v0" | "v1" | "sglang" | "llamacpp"
    multiprocess: bool = False
    model: str = "sim-model"
    tp_size: int = 1    # sglang: every tensor-parallel rank exports the scheduler series


@dataclass
class Family:
    name: str  # for counters: the name without _total (as prometheus_client declares it)
    type: str  # gauge | counter | histogram
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)
    created: list[tuple[Labels, float]] = field(default_factory=list)

    @property
    def wire_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, labels: Labels, value: float) -> str:
    return f"{name}{_labels(labels)} {floatToGoString(value)}\n"


def _histogram_samples(fam: Family, labels: Labels, hist: Histogram, multiprocess: bool) -> None:
    buckets = [
        (fam.name + "_bucket", {**labels, "le": floatToGoString(bound)}, float(count))
        for bound, count in hist.cumulative()
    ]
    count = (fam.name + "_count", labels, float(hist.count))
    total = (fam.name + "_sum", labels, float(hist.total))
    if multiprocess:
        fam.samples.extend([total, *buckets, count])
    else:
        fam.samples.extend([*buckets, count, total])


def _cache_config_labels(engine: Engine, flavour: Flavour) -> Labels:
    labels = {
        "block_size": str(engine.block_size),
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": "True" if flavour.engine == "v1" else "False",
        "gpu_memory_utilization": "0.9",
        "is_attention_free": "False",
        "num_cpu_blocks": "None" if flavour.engine == "v1" else "4096",
        "num_gpu_blocks": str(engine.kv_blocks),
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "swap_space_bytes": "4294967296",
    }
    if flavour.engine == "v1":
        labels["prefix_caching_hash_algo"] = "sha256"
        labels["engine"] = str(engine.index)
    return labels


def vllm_families(engines: Sequence[Engine], flavour: Flavour, created: float) -> list[Family]:
    v1 = flavour.engine == "v1"
    with_created = v1 and not flavour.multiprocess

    def base(engine: Engine) -> Labels:
        labels = {"model_name": flavour.model}
        if v1:
            labels["engine"] = str(engine.index)
        return labels

    def gauge(name: str, help_text: str, value_of) -> Family:  # noqa: ANN001
        fam = Family(name, "gauge", help_text)
        for e in engines:
            fam.samples.append((name, base(e), float(value_of(e))))
        return fam

    def counter(name: str, help_text: str, value_of) -> Family:  # noqa: ANN001
        fam = Family(name, "counter", help_text)
        for e in engines:
            fam.samples.append((name + "_total", base(e), float(value_of(e))))
            if with_created:
                fam.created.append((base(e), created))
        return fam

    def histogram(name: str, help_text: str, hist_of) -> Family:  # noqa: ANN001
        fam = Family(name, "histogram", help_text)
        for e in engines:
            _histogram_samples(fam, base(e), hist_of(e), flavour.multiprocess)
            if with_created:
                fam.created.append((base(e), created))
        return fam

    cache_info = Family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    for e in engines if v1 else engines[:1]:
        cache_info.samples.append(("vllm:cache_config_info", _cache_config_labels(e, flavour), 1.0))

    success = Family("vllm:request_success", "counter", "Count of successfully processed requests.")
    for e in engines:
        for reason, n in e.stats.request_success.items():
            labels = {**base(e), "finished_reason": reason}
            success.samples.append(("vllm:request_success_total", labels, float(n)))
            if with_created:
                success.created.append((labels, created))

    running_help = (
        "Number of requests in model execution batches." if v1 else "Number of requests currently running on GPU."
    )
    fams: list[Family] = []
    if not v1:
        fams.append(cache_info)
    fams.append(gauge("vllm:num_requests_running", running_help, lambda e: e.stats.running))
    if not v1:
        fams.append(gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lambda e: 0))
    fams.append(gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                      lambda e: e.stats.waiting))
    if v1:
        sleep = Family(
            "vllm:engine_sleep_state",
            "gauge",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        )
        for e in engines:
            level = getattr(e, "sleep_level", 0)
            for state, value in (("awake", float(level == 0)), ("weights_offloaded", float(level == 1)),
                                 ("discard_all", float(level == 2))):
                sleep.samples.append(("vllm:engine_sleep_state", {**base(e), "sleep_state": state}, value))
        fams.append(sleep)
        fams.append(gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          lambda e: e.stats.kv_usage))
        fams.append(counter("vllm:prefix_cache_queries",
                            "Prefix cache queries, in terms of number of queried tokens.",
                            lambda e: e.stats.prefix_cache_queries))
        fams.append(counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            lambda e: e.stats.prefix_cache_hits))
    else:
        fams.append(gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                          lambda e: e.stats.kv_usage))
        fams.append(gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.",
                          lambda e: 0))
    fams.append(counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                        lambda e: e.stats.preemptions))
    fams.append(counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                        lambda e: e.stats.prompt_tokens))
    fams.append(counter("vllm:generation_tokens", "Number of generation tokens processed.",
                        lambda e: e.stats.generation_tokens))
    fams.append(success)
    fams.append(histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                          lambda e: e.stats.iteration_tokens))
    fams.append(histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                          lambda e: e.stats.ttft))
    fams.append(histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                          lambda e: e.stats.e2e))
    if v1:   # V1 >= 0.10 (verified on vLLM CPU 0.32.0's page): how long its steps take
        fams.append(histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              lambda e: e.stats.inter_token))
        fams.append(histogram("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", lambda e: e.stats.prefill_time))
        fams.append(cache_info)
    return fams


def http_requests_family(counts: HttpCounts, with_created: bool) -> Family:
    """http_requests_total of the API server, its children in the order they were first used."""
    fam = Family("http_requests", "counter", HTTP_REQUESTS_HELP)
    for (handler, method, status), (n, created) in counts.items():
        labels = {"handler": handler, "method": method, "status": status}
        fam.samples.append(("http_requests_total", labels, float(n)))
        if with_created:
            fam.created.append((labels, created))
    return fam


def sglang_families(engines: Sequence[Engine], flavour: Flavour) -> list[Family]:
    """SGLang 0.5.x: scheduler gauges and counters per (dp_rank, tp_rank), tokenizer counters per model."""
    dp = len(engines) > 1

    def sched(engine: Engine, tp_rank: int) -> Labels:
        labels = {"model_name": flavour.model, "engine_type": "unified", "tp_rank": str(tp_rank),
                  "pp_rank": "0", "moe_ep_rank": "0"}
        if dp:
            labels["dp_rank"] = str(engine.index)
        return labels

    # tokenizer side (0.5.23, verified on the real page): request counters and latency histograms carry
    # engine_type and is_streaming too, cached tokens their cache_source
    tok = {"engine_type": "unified", "is_streaming": "false", "model_name": flavour.model}
    cached = {"cache_source": "device", "engine_type": "unified", "model_name": flavour.model}

    def gauge(name: str, value_of) -> Family:  # noqa: ANN001
        fam = Family(name, "gauge", MULTIPROCESS_HELP)
        for e in engines:
            for tp in range(flavour.tp_size):
                fam.samples.append((name, sched(e, tp), float(value_of(e))))
        return fam

    def total(name: str, value_of, labels: Labels = tok) -> Family:  # noqa: ANN001
        fam = Family(name, "counter", MULTIPROCESS_HELP)
        fam.samples.append((name + "_total", labels, float(sum(value_of(e) for e in engines))))
        return fam

    passes = Family("sglang:cuda_graph_passes", "counter", MULTIPROCESS_HELP)
    for e in engines:
        for tp in range(flavour.tp_size):
            for mode, n in (("decode_cuda_graph", e.stats.decode_passes), ("prefill_none", e.stats.prefill_passes)):
                passes.samples.append(("sglang:cuda_graph_passes_total", {**sched(e, tp), "mode": mode}, float(n)))

    realtime = Family("sglang:realtime_tokens", "counter", MULTIPROCESS_HELP)  # per rank, every step
    for e in engines:
        for tp in range(flavour.tp_size):
            for mode, n in (("prefill_compute", e.stats.prompt_tokens - e.stats.prefix_cache_hits),
                            ("decode", e.stats.generation_tokens), ("prefill_cache", e.stats.prefix_cache_hits)):
                realtime.samples.append(("sglang:realtime_tokens_total", {**sched(e, tp), "mode": mode}, float(n)))

    def merged(hist_of) -> Histogram:  # noqa: ANN001
        first = hist_of(engines[0])
        out = Histogram(first.buckets)
        for e in engines:
            h = hist_of(e)
            out.count += h.count
            out.total += h.total
            out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
        return out

    def histogram(name: str, hist_of) -> Family:  # noqa: ANN001
        fam = Family(name, "histogram", MULTIPROCESS_HELP)
        _histogram_samples(fam, tok, merged(hist_of), multiprocess=True)
        return fam

    tokens_capacity = engines[0].kv_blocks * engines[0].block_size
    aborted = sum(e.stats.request_success.get("abort", 0) for e in engines)
    return [
        total("sglang:prompt_tokens", lambda e: e.stats.prompt_tokens),
        total("sglang:generation_tokens", lambda e: e.stats.generation_tokens),
        total("sglang:cached_tokens", lambda e: e.stats.prefix_cache_hits, cached),
        total("sglang:num_requests", lambda e: e.stats.finished),
        *([total("sglang:num_aborted_requests", lambda e: e.stats.request_success.get("abort", 0))]
          if aborted else []),  # a labelled counter appears once it was incremented (multiprocess registry)
        passes,
        realtime,
        gauge("sglang:num_running_reqs", lambda e: e.stats.running),
        gauge("sglang:num_queue_reqs", lambda e: e.stats.waiting),
        gauge("sglang:num_grammar_queue_reqs", lambda e: 0),
        gauge("sglang:num_used_tokens", lambda e: round(e.stats.kv_usage * tokens_capacity)),
        gauge("sglang:token_usage", lambda e: e.stats.kv_usage),
        gauge("sglang:gen_throughput", lambda e: 0.0),
        gauge("sglang:cache_hit_rate", lambda e: 0.0),
        gauge("sglang:max_total_num_tokens", lambda e: float(tokens_capacity)),
        histogram("sglang:time_to_first_token_seconds", lambda e: e.stats.ttft),
        histogram("sglang:e2e_request_latency_seconds", lambda e: e.stats.e2e),
    ]


LLAMACPP_SERIES: tuple[tuple[str, str, str], ...] = (
    # (wire name without prefix, type, HELP) in llama-server's order (b11434)
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("prompt_seconds_total", "counter", "Prompt process time"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", "counter", "Predict process time"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens served from the cache."),
    ("n_decode_total", "counter", "Total number of llama_decode() calls"),
    ("n_tokens_max", "counter", "Largest observed n_tokens."),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s."),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s."),
    ("requests_processing", "gauge", "Number of requests processing."),
    ("requests_deferred", "gauge", "Number of requests deferred."),
)


def _llamacpp_number(value: float) -> str:
    """llama-server prints integers as integers and other numbers with 6 significant digits."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def render_llamacpp(engine: Engine) -> str:
    """llama-server's /metrics page. Resets the throughput window (as every read of the real one does)."""
    st = engine.stats
    prompt_tps, predicted_tps = st.take_window()
    values = {
        "prompt_tokens_total": st.prompt_tokens,
        "prompt_seconds_total": st.prompt_seconds,
        "tokens_predicted_total": st.tokens_predicted,
        "tokens_predicted_seconds_total": st.predicted_seconds,
        "prompt_tokens_cached_total": 0,
        "n_decode_total": st.steps,
        "n_tokens_max": st.n_tokens_max,
        "n_busy_slots_per_decode": st.busy_slot_decodes / st.steps if st.steps else 0.0,
        "prompt_tokens_seconds": prompt_tps,
        "predicted_tokens_seconds": predicted_tps,
        "requests_processing": st.running,
        "requests_deferred": st.waiting,
    }
    out: list[str] = []
    for name, kind, help_text in LLAMACPP_SERIES:
        wire = "llamacpp:" + name
        out.append(f"# HELP {wire} {help_text}\n# TYPE {wire} {kind}\n{wire} {_llamacpp_number(float(values[name]))}\n")
    return "".join(out)


def _memory() -> tuple[float, float]:
    try:
        with open("/proc/self/statm") as f:
            pages = f.read().split()
        size = os.sysconf("SC_PAGE_SIZE")
        return float(int(pages[0]) * size), float(int(pages[1]) * size)
    except (OSError, ValueError, IndexError):
        rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return rss, rss


def process_families(process_start_time: float) -> list[Family]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        open_fds = float(len(os.listdir("/proc/self/fd")))
    except OSError:
        open_fds = 0.0
    max_fds = float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    gc_collected = Family("python_gc_objects_collected", "counter", "Objects collected during gc")
    gc_uncollectable = Family("python_gc_objects_uncollectable", "counter", "Uncollectable objects found during GC")
    gc_collections = Family("python_gc_collections", "counter", "Number of times this generation was collected")
    for gen, st in enumerate(gc.get_stats()):
        labels = {"generation": str(gen)}
        gc_collected.samples.append(("python_gc_objects_collected_total", labels, float(st["collected"])))
        gc_uncollectable.samples.append(("python_gc_objects_uncollectable_total", labels, float(st["uncollectable"])))
        gc_collections.samples.append(("python_gc_collections_total", labels, float(st["collections"])))
    info = Family("python_info", "gauge", "Python platform information")
    major, minor, patch = platform.python_version_tuple()
    info.samples.append(("python_info", {"implementation": platform.python_implementation(), "major": major,
                                         "minor": minor, "patchlevel": patch,
                                         "version": platform.python_version()}, 1.0))
    vm = Family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
    rss = Family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
    vm_bytes, rss_bytes = _memory()
    vm.samples.append(("process_virtual_memory_bytes", {}, vm_bytes))
    rss.samples.append(("process_resident_memory_bytes", {}, rss_bytes))
    start = Family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
    start.samples.append(("process_start_time_seconds", {}, process_start_time))
    cpu = Family("process_cpu_seconds", "counter", "Total user and system CPU time spent in seconds.")
    cpu.samples.append(("process_cpu_seconds_total", {}, usage.ru_utime + usage.ru_stime))
    fds = Family("process_open_fds", "gauge", "Number of open file descriptors.")
    fds.samples.append(("process_open_fds", {}, open_fds))
    mfds = Family("process_max_fds", "gauge", "Maximum number of open file descriptors.")
    mfds.samples.append(("process_max_fds", {}, max_fds))
    return [gc_collected, gc_uncollectable, gc_collections, info, vm, rss, start, cpu, fds, mfds]


def format_families(fams: Sequence[Family], multiprocess: bool) -> str:
    out: list[str] = []
    if multiprocess:
        order = {"counter": 0, "gauge": 1, "histogram": 2}
        fams = sorted(fams, key=lambda f: order.get(f.type, 3))
    for fam in fams:
        out.append(f"# HELP {fam.wire_name} {fam.help}\n")
        out.append(f"# TYPE {fam.wire_name} {fam.type}\n")
        out.extend(_line(name, labels, value) for name, labels, value in fam.samples)
        if fam.created and not multiprocess:
            cname = fam.name + "_created"
            out.append(f"# HELP {cname} {fam.help}\n")
            out.append(f"# TYPE {cname} gauge\n")
            out.extend(_line(cname, labels, value) for labels, value in fam.created)
    return "".join(out)


def render(
    engines: Engine | Sequence[Engine],
    flavour: Flavour | str = "v1",
    *,
    process_start_time: float = 0.0,
    created: float | None = None,
    http_requests: HttpCounts | None = None,
) -> str:
    """The exposition text of a server with these engines (one per DP rank, `engine="0"`...).

    `http_requests`: the API server's request counts (v1 only; None: no http_requests_total family, an
    empty mapping: the family's HELP and TYPE without samples, as on a server that only got probes)."""
    if isinstance(engines, Engine):
        engines = [engines]
    if isinstance(flavour, str):
        flavour = Flavour(engine=flavour)
    if flavour.engine not in ENGINES:
        raise ValueError(f"unknown engine flavour {flavour.engine!r}")
    if flavour.engine == "llamacpp":
        if len(engines) != 1:
            raise ValueError("llama-server has one engine")
        return render_llamacpp(engines[0])
    if flavour.engine == "sglang":
        return format_families(sglang_families(engines, flavour), multiprocess=True)
    fams: list[Family] = []
    if not flavour.multiprocess:
        fams.extend(process_families(process_start_time))
    fams.extend(vllm_families(engines, flavour, process_start_time if created is None else created))
    if flavour.engine == "v1" and http_requests is not None:
        fams.append(http_requests_family(http_requests, with_created=not flavour.multiprocess))
    return format_families(fams, flavour.multiprocess)
