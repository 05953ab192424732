"""Realistic vLLM v1 `/metrics` pages for the scale benchmarks, built with `simulator.metrics`.

`simulator.metrics.render` gives the families the simulator models (5 histograms). A real vLLM
0.10/0.11 v1 page carries ten more request histograms (names and buckets from
docs/reference/vllm-metrics-facts.md §1.2); `full=True` adds them, built with the
simulator's own `Family` / histogram formatting, so the page has the size and shape the exporter
meets in production (two engines, every histogram with its `_created` series).
"""

from __future__ import annotations

from llm_health.simulator.engine import REQUEST_LATENCY_BUCKETS, Engine, Histogram
from llm_health.simulator.metrics import (
    Family,
    Flavour,
    _histogram_samples,
    format_families,
    process_families,
    vllm_families,
)

FLAVOUR = Flavour(engine="v1", model="meta-llama/Llama-3.1-70B-Instruct")
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)


def _one_two_five(limit: int) -> tuple[float, ...]:
    out: list[float] = []
    base = 1
    while True:
        for m in (1, 2, 5):
            if base * m > limit:
                return tuple(out)
            out.append(float(base * m))
        base *= 10


EXTRA_HISTOGRAMS: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", TPOT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TPOT_BUCKETS),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _one_two_five(131_072)),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", _one_two_five(131_072)),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     _one_two_five(131_072)),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", _one_two_five(131_072)),
    ("vllm:request_params_n", "Histogram of the n request parameter.", (1.0, 2.0, 5.0, 10.0, 20.0)),
)


def _extra(engines: list[Engine], created: float) -> list[Family]:
    fams = []
    for name, help_text, buckets in EXTRA_HISTOGRAMS:
        fam = Family(name, "histogram", help_text)
        for e in engines:
            h = Histogram(buckets)
            # plausible contents: one observation per finished request, derived from the engine's state
            for value in e.stats.e2e.cumulative()[:3]:
                h.observe(value[0] if value[0] != float("inf") else 1.0)
            labels = {"model_name": FLAVOUR.model, "engine": str(e.index)}
            _histogram_samples(fam, labels, h, False)
            fam.created.append((labels, created))
        fams.append(fam)
    return fams


def page_variants(n: int, full: bool = True, step_seconds: float = 0.1, every: float = 15.0) -> list[str]:
    """`n` successive pages of one busy two-engine server, `every` engine-seconds apart (counters rise)."""
    engines = [Engine(index=i, step_seconds=step_seconds, max_num_seqs=64, kv_blocks=65_536) for i in range(2)]
    for e in engines:
        for k in range(48):
            e.submit(500 + 37 * k, 8_000)
    start = 1_764_400_000.0
    pages = []
    for k in range(n):
        for e in engines:
            e.advance_to((k + 1) * every)
        fams = process_families(start) + vllm_families(engines, FLAVOUR, start)
        if full:   # the families the simulator does not render itself (it has inter-token and prefill time)
            have = {f.name for f in fams}
            fams += [f for f in _extra(engines, start) if f.name not in have]
        pages.append(format_families(fams, False))
    return pages
