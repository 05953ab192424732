"""exporter/fastparse.py: the fast path gives exactly what the full parse gives, on every saved real page
and on the pages it must not be fooled by (a kept series where only a skipped family was expected)."""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.pages import page_variants
from llm_health.exporter import fastparse
from llm_health.exporter.fastparse import Names, parse_fast
from llm_health.exporter.parser import Page, parse, parse_lines
from llm_health.exporter.reading import VLLM_RUNNING, from_page, read_text, wanted
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import Flavour, render
from tests.support.paths import PAGES

CAPTURES = sorted(PAGES.glob("*.txt"))
HELPS = (VLLM_RUNNING,)


@pytest.fixture(params=["blocks everywhere", "default", "line by line"])
def block_bytes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Every family a block, the default size, no family a block: the same answer each time."""
    size = {"blocks everywhere": 0, "default": fastparse.BLOCK_BYTES, "line by line": 10**9}[request.param]
    monkeypatch.setattr(fastparse, "BLOCK_BYTES", size)
    yield size


def _samples(page: Page) -> list[tuple[str, list[tuple[str, str]], str]]:
    # repr: NaN equals NaN; the labels' order is part of what the parser returns
    return [(s.name, list(s.labels.items()), repr(s.value)) for s in page.samples]


def one_by_one(text: str, keep: Names, helps: tuple[str, ...]) -> Page:
    """parse(), each line read on its own: nothing the line reader remembers from the line before helps."""
    page = Page()
    counts = [parse_lines([line], keep, helps, page) for line in text.split("\n")]
    page._counts = (sum(c[0] for c in counts), sum(c[1] for c in counts))
    return page


def same(text: str, keep: Names = wanted, helps: tuple[str, ...] = HELPS) -> Page:
    """The fast page, after checking it is the full parse's in every part (and the full parse is what its
    lines give one by one)."""
    full, fast, alone = parse(text, keep, helps), parse_fast(text, keep, helps), one_by_one(text, keep, helps)
    assert _samples(full) == _samples(alone)
    assert (full.helps, full.prefixes, full.lines, full.skipped) == (alone.helps, alone.prefixes, alone.lines,
                                                                   alone.skipped)
    assert _samples(fast) == _samples(full)
    assert fast.helps == full.helps
    assert fast.prefixes == full.prefixes
    assert (fast.lines, fast.skipped) == (full.lines, full.skipped)
    return fast


def names(page: Page) -> list[str]:
    return [s.name for s in page.samples]


def _busy(flavour: str, index: int = 0) -> Engine:
    e = Engine(flavour=flavour, index=index, max_num_seqs=4)
    for _ in range(6):
        e.submit(prompt_tokens=300, max_tokens=50)
    e.advance_to(0.5)
    return e


# built on first use (the bench pages run a simulated engine for about a second): not at collection, which
# every xdist worker repeats
PAGE_BUILDERS: dict[str, Callable[[], str]] = {
    "bench-full": lambda: page_variants(2)[1],
    "bench-simulator": lambda: page_variants(2, full=False)[1],
    "sim-v0": lambda: render(_busy("v0"), "v0", process_start_time=1.7e9),
    # with the API server's http_requests_total (and its _created), and with the family still empty
    "sim-v1-http": lambda: render(_busy("v1"), "v1", process_start_time=1.7e9, http_requests={
        ("/v1/completions", "POST", "2xx"): (3, 1.7e9), ("/v1/completions", "POST", "5xx"): (1, 1.7e9 + 1)}),
    "sim-v1-http-empty": lambda: render(_busy("v1"), "v1", process_start_time=1.7e9, http_requests={}),
    "sim-v1-mp": lambda: render(_busy("v1"), Flavour("v1", multiprocess=True)),
    "sim-sglang": lambda: render(_busy("sglang"), "sglang"),
    "sim-llamacpp": lambda: render(_busy("llamacpp"), "llamacpp"),
}


@functools.cache
def built_page(name: str) -> str:
    return PAGE_BUILDERS[name]()


def test_there_are_real_pages_to_compare() -> None:
    assert len(CAPTURES) >= 10 and all(p.stat().st_size > 500 for p in CAPTURES)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_saved_real_page_parses_the_same(path: Path, block_bytes: int) -> None:
    text = path.read_text()
    page = same(text)
    same(text, Names({s.name for s in parse(text).samples}))              # every name on the page kept
    same(text, Names((), rules=(("", "_total"), ("sglang:", ""))), helps=("sglang:num_running_reqs",))
    same(text.replace("\n", "\r\n"))
    assert page.samples or "python-only" in path.name or "two-engines" in path.name


@pytest.mark.parametrize("name", sorted(PAGE_BUILDERS))
def test_the_benchmark_and_simulator_pages_parse_the_same(name: str, block_bytes: int) -> None:
    page = same(built_page(name))
    assert page.samples


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_saved_real_page_reads_the_same(path: Path) -> None:
    text = path.read_text()
    full = from_page(parse(text, wanted, HELPS))
    assert json.loads(read_text(text).to_json()) == json.loads(full.to_json())


# ---- pages built to fool a fast path --------------------------------------------------------------

def histogram(name: str, labels: str = 'engine="0",model_name="m"', buckets: int = 30, created: bool = True,
              help_line: bool = True) -> str:
    """A prometheus_client histogram family, long enough to be taken as a block."""
    out = [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"] if help_line else []
    for i in range(buckets):
        out.append(f'{name}_bucket{{{labels},le="{0.01 * 2 ** i:g}"}} {min(i, 7)}.0')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} 7.0')
    out += [f"{name}_count{{{labels}}} 7.0", f"{name}_sum{{{labels}}} 3.5"]
    if created:
        out.append(f"{name}_created{{{labels}}} 1.7644e+09")
    return "\n".join(out)


def gauge(name: str, value: str = "1.0", labels: str = 'engine="0",model_name="m"') -> str:
    return f"# HELP {name} A gauge.\n# TYPE {name} gauge\n{name}{{{labels}}} {value}"


RUNNING = gauge(VLLM_RUNNING, "3.0")


def page(*parts: str) -> str:
    return "\n".join(parts) + "\n"


def test_the_created_series_of_a_skipped_histogram_are_kept(block_bytes: int) -> None:
    text = page(RUNNING, histogram("vllm:request_queue_time_seconds"),
                histogram("vllm:request_queue_time_seconds", labels='engine="1",model_name="m"'))
    got = same(text)
    assert names(got) == [VLLM_RUNNING, "vllm:request_queue_time_seconds_created",
                          "vllm:request_queue_time_seconds_created"]
    assert read_text(text).created       # the process identity of a V1 engine


def test_a_kept_histogram_keeps_every_bucket(block_bytes: int) -> None:
    got = same(page(RUNNING, histogram("vllm:inter_token_latency_seconds")))
    assert names(got).count("vllm:inter_token_latency_seconds_bucket") == 31
    assert "vllm:inter_token_latency_seconds_created" in names(got)
    assert "vllm:inter_token_latency_seconds_sum" not in names(got)


def test_a_kept_series_inside_a_skipped_family_is_found(block_bytes: int) -> None:
    """No HELP line of its own: it sits among the buckets of a family nothing is kept of."""
    hist = histogram("vllm:request_queue_time_seconds", created=False).split("\n")
    hist.insert(15, f'{VLLM_RUNNING}{{engine="0"}} 5.0')
    hist.insert(20, "vllm:num_requests_waiting 2.0")
    got = same(page(RUNNING, "\n".join(hist)))
    assert names(got) == [VLLM_RUNNING, VLLM_RUNNING, "vllm:num_requests_waiting"]


def test_a_kept_name_that_extends_the_family_name_is_found(block_bytes: int) -> None:
    lines = [f'vllm:num_requests{{engine="0",n="{i}"}} {i}' for i in range(40)]
    lines.insert(25, f'{VLLM_RUNNING}{{engine="0"}} 4.0')
    lines.insert(30, f"{VLLM_RUNNING} 6.0")
    got = same(page("# HELP vllm:num_requests x", "# TYPE vllm:num_requests gauge", *lines))
    assert [s.value for s in got.samples] == [4.0, 6.0]


def test_the_prefix_of_a_family_nothing_is_kept_of_is_seen(block_bytes: int) -> None:
    text = page(histogram("sglang:queue_time_seconds", created=False), RUNNING)
    assert same(text).prefixes == {"sglang", "vllm"}
    assert read_text(text).flavour == "v1"          # vLLM and SGLang series: vLLM wins (an `engine` label: V1)
    no_colon = histogram("abc_seconds", created=False).split("\n")
    no_colon.insert(12, 'abc_seconds:odd_bucket{le="1"} 1')       # a ':' after the family name: prefix "abc_seconds"
    assert same(page("\n".join(no_colon))).prefixes == {"abc_seconds"}


def test_escaped_label_values_and_label_oddities(block_bytes: int) -> None:
    odd = [
        f'{VLLM_RUNNING}{{engine="0",model_name="a \\"quoted\\" \\\\ back\\nslash, {{brace}} = x"}} 1',
        f'{VLLM_RUNNING}{{ engine = "1" , }} 2',
        f'{VLLM_RUNNING}{{engine="2",}} 3',
        f"{VLLM_RUNNING}{{}} 4",
        f'{VLLM_RUNNING}{{engine="3",engine="4"}} 5',
        f'{VLLM_RUNNING}{{engine="5"}}6',
        f'{VLLM_RUNNING}{{1bad="x"}} 7',
        f'{VLLM_RUNNING}{{engine="unterminated}} 8',
        f'{VLLM_RUNNING}{{engine="6"model_name="m"}} 9',
        f'{VLLM_RUNNING}{{engine="7"}} 10 1700000000000',
        f'{VLLM_RUNNING}{{engine="8"}} not-a-number',
        f'{VLLM_RUNNING}{{engine="9"}}',
        "\0vllm:nul_first{a=\"b\"} 1",
        "\0nul",
    ]
    skipped = histogram("vllm:request_queue_time_seconds", labels='engine="0",model_name="x \\" } y"')
    got = same(page(RUNNING, skipped, *odd))
    assert [s.value for s in got.samples if s.name == VLLM_RUNNING] == [3, 1, 2, 3, 4, 5, 6, 10]
    assert got.samples[2].labels["model_name"] == 'a "quoted" \\ back\nslash, {brace} = x'
    assert got.skipped == 6
    assert "\0vllm" in got.prefixes
    first = same('\0vllm:nul_first{a="b"} 1\n\0nul\n')           # nothing read before them
    assert first.prefixes == {"\0vllm"} and first.skipped == 1
    assert 'model_name="x \\" } y"' in skipped and "vllm:request_queue_time_seconds_created" in names(got)


def test_comments_of_every_kind(block_bytes: int) -> None:
    text = page(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        f"# TYPE {VLLM_RUNNING} gauge",
        f'{VLLM_RUNNING}{{engine="0"}} 1',
        histogram("vllm:request_queue_time_seconds", help_line=False),        # TYPE-less, HELP-less family
        "   # HELP vllm:num_requests_running indented, and later: it wins   ",
        histogram("vllm:request_decode_time_seconds"),
        "#no space comment",
        "# EOF",
        f'{VLLM_RUNNING}{{engine="1",note="# HELP {VLLM_RUNNING} not a comment"}} 2',
    )
    got = same(text)
    assert got.helps == {VLLM_RUNNING: "indented, and later: it wins"}
    assert [s.value for s in got.samples if s.name == VLLM_RUNNING] == [1, 2]
    assert names(got).count("vllm:request_queue_time_seconds_created") == 1
    crlf = same(text.replace("\n", "\r\n"))
    assert crlf.helps == got.helps and _samples(crlf) == _samples(got)


def test_nan_inf_and_odd_values(block_bytes: int) -> None:
    values = ["NaN", "+Inf", "-Inf", "1e+09", "-0.0", "0x1p3", "1_000", "nan", "Infinity"]
    hist = histogram("vllm:inter_token_latency_seconds").replace("} 7.0", "} NaN").replace("} 3.0", "} +Inf")
    got = same(page(*(gauge(VLLM_RUNNING, v) for v in values), hist))
    assert math.isnan(got.samples[0].value) and got.samples[1].value == math.inf
    assert any(math.isnan(s.value) for s in got.samples if s.name.endswith("_bucket"))


def test_blank_lines_leading_blanks_and_no_final_newline(block_bytes: int) -> None:
    hist = histogram("vllm:request_queue_time_seconds")
    variants = [
        page(RUNNING, hist).rstrip("\n"),                                       # no final newline
        page(RUNNING, "", hist, "", "", RUNNING) + "\n\n",                       # blank lines
        page(RUNNING, hist.replace("\nvllm:request_queue_time_seconds_sum", "\n  vllm:request_queue_time_seconds_sum")),
        page(RUNNING, hist.replace("_sum{", "_sum \t{")),
        page(RUNNING, hist, "vllm:request_queue_time_seconds_created ", "vllm:trailing_created 1  "),
        page(hist + "\nvllm:request_queue_time_seconds_created\t1.5", RUNNING),   # a tab: no name, skipped
        "\n".join("  " + ln for ln in page(RUNNING, hist).split("\n")),
        "",
        "\n",
        "# HELP x\n",
    ]
    for text in variants:
        same(text)


def test_a_family_that_is_one_name_of_many_lines(block_bytes: int) -> None:
    """A gauge with many label sets (no suffix to strip): the block's family is the name itself."""
    lines = [f'vllm:engine_sleep_state{{engine="{i}",sleep_state="awake"}} 1' for i in range(60)]
    got = same(page(RUNNING, "# HELP vllm:engine_sleep_state x", *lines))
    assert names(got).count("vllm:engine_sleep_state") == 60


def test_random_pages_parse_the_same(block_bytes: int) -> None:
    """Real families cut, moved, mixed and damaged at random (seeded): whatever the fast path skips or
    reads, the answer is the full parse's."""
    rng = random.Random(25)
    sources = [p.read_text().split("\n") for p in CAPTURES if p.stat().st_size > 40_000]
    sources.append(built_page("bench-full").split("\n"))
    junk = [f"{VLLM_RUNNING} 9", f'{VLLM_RUNNING}{{engine="0"}} 8', "vllm:x_created 1", "", " ", "#", "# TYPE",
            "vllm:request_success_total{a=\"b\"} 2", "garbage", "sglang:token_usage 0.5", "  vllm:num_requests_waiting 1",
            "process_start_time_seconds 1.7e9", "vllm:iteration_tokens_total_count{engine=\"0\"} 3\r"]
    for _ in range(60):
        lines = rng.choice(sources)[:]
        for _ in range(rng.randrange(6)):
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(junk))
        if rng.random() < 0.3:
            lines = [ln for ln in lines if not ln.startswith("# HELP") or rng.random() < 0.5]
        if rng.random() < 0.3:
            i = rng.randrange(len(lines))
            lines[i:i] = lines[rng.randrange(len(lines)):][:rng.randrange(40)]     # a run of lines repeated
        same("\n".join(lines))


def test_line_counts_are_counted_only_when_asked() -> None:
    text = page(RUNNING, "garbage", histogram("vllm:request_queue_time_seconds"))
    fast, full = parse_fast(text, wanted, HELPS), parse(text, wanted, HELPS)
    assert fast._counts is None
    assert (fast.lines, fast.skipped) == (full.lines, full.skipped) == (full.lines, 1)


def test_the_caches_of_names_are_bounded() -> None:
    keep = Names({"a"}, rules=(("vllm:", "_created"),))
    text = "\n".join(f"# HELP m{i} x\n" + "\n".join(f'm{i}_bucket{{le="{j}"}} 1' for j in range(40))
                     for i in range(300))
    for k in range(20):
        same(text.replace("m", f"m{k}x"), keep)
    assert len(keep._families) <= fastparse._CACHE_MAX and len(keep._decided) <= fastparse._CACHE_MAX


def test_step_histograms_grouped_by_series_whatever_the_order() -> None:
    """from_page groups buckets by series (name and labels but le): interleaved series, labels in another
    order, a bucket without le or with a bad le."""
    name = "vllm:inter_token_latency_seconds_bucket"
    lines = [
        f'{name}{{engine="0",le="0.1"}} 0', f'{name}{{engine="1",le="0.1"}} 0',
        f'{name}{{le="0.5",engine="0"}} 2', f'{name}{{engine="1",le="0.5"}} 1',
        f'{name}{{engine="0",le="1.0"}} 2', f'{name}{{engine="1",le="2.5"}} 3',
        f'{name}{{engine="0"}} 9', f'{name}{{engine="0",le="bad"}} 9',
        f'{name}{{engine="0",le="+Inf"}} 2', f'{name}{{engine="1",le="+Inf"}} 3',
    ]
    r = read_text(page(RUNNING, *lines))
    assert r.step_seconds == 2.5                  # engine 1's highest non-empty bucket; engine 0's is 0.5
    r = read_text(page(RUNNING, *lines[:5], f'{name}{{engine="0",le="+Inf"}} 4'))
    assert r.step_seconds == math.inf             # an observation beyond every finite bound
