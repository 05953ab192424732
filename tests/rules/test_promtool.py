"""promtool unit tests for the rules: per alert, the cases that must fire and the traps that must not.

The scenarios are written here in Python (so expected annotations follow the rules), emitted as
rules/tests/llm_health_test.yml (checked in: `promtool test rules rules/tests/llm_health_test.yml`
works without Python) and run through the real promtool. Scrape interval 15s everywhere.
Regenerate the checked-in file with LLM_HEALTH_UPDATE_RULE_TESTS=1 pytest tests/rules/test_promtool.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from llm_health.render.rules import TIERED_ALERTS
from tests.support.promtool import (
    EXPORTER,
    PROMTOOL,
    RULE_FILES,
    RULES_DIR,
    VALUE,
    N,
    Scenario,
    alert_rule_list,
    alert_rules,
    error_rate_quiet,
    exporter_series,
    histogram_series,
    http_series,
    llamacpp_backend,
    promtool_document,
    run_promtool_tests,
    seq,
    series,
    sglang_backend,
    target_labels,
    vllm_backend,
    vllm_labels,
)

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")

CHECKED_IN = RULES_DIR / "tests" / "llm_health_test.yml"


def busy_and_probes() -> Scenario:
    s = Scenario("busy at 12/12 slots for an hour; probes only count against busy backends")
    s.add(vllm_backend("busy", running=f"12x{N}", waiting=f"30x{N}", progress=f"0+300x{N}", up=f"1x{N}", kv=f"0.8x{N}"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "busy", "result": "ok"}, f"5x{N}"))
    # Busy at every reading; the probe counter moves at 30m: our principle broken.
    s.add(vllm_backend("busyprobed", running=f"12x{N}", waiting=f"3x{N}", progress=f"0+300x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "busyprobed", "result": "ok"}, "5x120 6x180"))
    # Idle backend probed every minute: fine.
    s.add(vllm_backend("idleprobed", running=f"0x{N}", waiting=f"0x{N}", progress=f"100x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "idleprobed", "result": "ok"}, f"0+0.25x{N}"))
    # Busy except one reading at 30m (the probe went in that idle moment): fine.
    s.add(vllm_backend("burstprobed", running="12x119 0 12x180", waiting="0x119 0 0x180", progress=f"0+300x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "burstprobed", "result": "ok"}, "5x120 6x180"))
    for at in ("30m", "60m"):
        s.silent(at, "LLMBackendStalled")
        s.silent(at, "LLMBackendRestarted")
        s.silent(at, "LLMKVCachePressure")
    s.silent("29m", "LLMHealthProbeSentToBusyBackend")
    s.expect("32m", "LLMHealthProbeSentToBusyBackend", {"backend": "busyprobed"})
    s.silent("36m", "LLMHealthProbeSentToBusyBackend")
    s.state("60m", "busy", 2)
    s.state("60m", "idleprobed", 1)
    s.value(
        "60m",
        'backend:vllm_generation_tokens:rate{backend="busy"}',
        [('backend:vllm_generation_tokens:rate{backend="busy"}', 20)],
    )
    s.value(
        "60m",
        'backend:vllm_requests_in_flight:sum{backend="busy"}',
        [('backend:vllm_requests_in_flight:sum{backend="busy"}', 42)],
    )
    return s


def stalls() -> Scenario:
    s = Scenario("stalled from counters (V1 and V0), and from the exporter's verdict")
    # V1: progress until 5m, then everything frozen with work present.
    s.add(vllm_backend("stuck", running=f"3x{N}", waiting=f"2x{N}", progress=f"0+100x20 2000x{N}", up=f"1x{N}"))
    # V0 wedged: its iteration count keeps growing from idle zero observations; that is not progress.
    s.add(
        vllm_backend(
            "v0stuck", v1=False, running=f"2x{N}", waiting=f"0x{N}", progress=f"0+50x8 400x{N}",
            iteration_count=f"0+1x{N}", up=f"1x{N}",
        )
    )
    # Only waiting (running can read 0 inside a wedge).
    s.add(vllm_backend("queued", running=f"0x{N}", waiting=f"7x{N}", progress=f"0+100x20 2000x{N}", up=f"1x{N}"))
    # Data parallel: engine 0 keeps serving, engine 1 wedges at 5m with work: the backend is stalled.
    s.add(vllm_backend("dp", running=f"3x{N}", waiting=f"0x{N}", progress=f"0+100x{N}", up=f"1x{N}"))
    s.add(vllm_backend("dp", running=f"2x{N}", waiting=f"0x{N}", progress=f"0+100x20 2000x{N}", up=f"1x{N}",
                       engine="1", target=False))
    # vLLM looks fine, the exporter says stalled from 2m.
    s.add(vllm_backend("expstuck", running=f"1x{N}", waiting=f"0x{N}", progress=f"0+10x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "expstuck"}, f"2x8 5x{N}"))
    # No `for` on top (stall_for 0s): the exporter's verdict fires at the first evaluation that sees it, the
    # counters' clause once its window (2m) is frozen: V0 frozen from 2m at 4m, the others frozen from 5m at 7m.
    s.silent("2m", "LLMBackendStalled")
    s.expect("3m", "LLMBackendStalled", {"backend": "expstuck"})
    s.expect("6m", "LLMBackendStalled", {"backend": "expstuck"}, {"backend": "v0stuck"})
    s.expect("6m45s", "LLMBackendStalled", {"backend": "expstuck"}, {"backend": "v0stuck"})
    s.expect(
        "7m15s", "LLMBackendStalled",
        {"backend": "expstuck"}, {"backend": "v0stuck"}, {"backend": "stuck"}, {"backend": "queued"}, {"backend": "dp"},
    )
    s.expect(
        "8m30s", "LLMBackendStalled",
        {"backend": "expstuck"}, {"backend": "v0stuck"}, {"backend": "stuck"}, {"backend": "queued"}, {"backend": "dp"},
    )
    s.state("6m", "stuck", 2)
    s.state("8m", "stuck", 5)
    s.state("8m", "v0stuck", 5)
    s.state("8m", "expstuck", 2)
    s.state("8m", "dp", 5)
    s.value(
        "8m",
        'backend:vllm_engine_progress:rate_stall_window{backend="stuck"}',
        [('backend:vllm_engine_progress:rate_stall_window{backend="stuck"}', 0)],
    )
    return s


def traps() -> Scenario:
    s = Scenario("traps: long prefill, V0 idle, restart mid-window, scrape gaps")
    # A long prefill on V1: counters frozen for the whole run, only the KV gauge moves.
    s.add(vllm_backend("prefill", running=f"1x{N}", waiting=f"0x{N}", progress=f"5000x{N}", up=f"1x{N}", kv=f"0.1+0.002x{N}"))
    # V0 idle: iteration count grows from zero observations, nothing else moves, no work.
    s.add(vllm_backend("v0idle", v1=False, running=f"0x{N}", waiting=f"0x{N}", progress=f"400x{N}", iteration_count=f"0+1x{N}", up=f"1x{N}"))
    # Restart at ~10m15s: one failed scrape, new start time, counters from 0.
    s.add(
        vllm_backend(
            "restart", running=f"4x40 stale 4x{N}", waiting=f"0x40 stale 0x{N}",
            progress=f"0+100x40 stale 0+100x{N}", up=f"1x40 0 1x{N}", kv=f"0.3x40 stale 0.3x{N}",
            start_time=f"1000x40 stale 2000x{N}",
        )
    )
    # The same restart without process_start_time_seconds (multiprocess mode): counter resets.
    s.add(
        vllm_backend(
            "mprestart", running=f"4x40 stale 4x{N}", waiting=f"0x40 stale 0x{N}",
            progress=f"0+100x40 stale 0+100x{N}", up=f"1x40 0 1x{N}", kv=f"0.3x40 stale 0.3x{N}",
            start_time=None,
        )
    )
    # Prometheus itself saw nothing for 5 minutes (no samples at all), counters were moving slowly.
    s.add(
        vllm_backend(
            "gap", running=f"3x40 _x20 3x{N}", waiting=f"0x40 _x20 0x{N}", progress=f"0+100x40 _x20 6100+100x{N}",
            up=f"1x40 _x20 1x{N}", kv=f"0.3x40 _x20 0.3x{N}", start_time=f"1000x40 _x20 1000x{N}",
        )
    )
    # 90 s of failed scrapes (up 0, stale markers) on a busy backend: shorter than the down grace.
    s.add(
        vllm_backend(
            "shortgap", running=f"3x40 stale _x5 3x{N}", waiting=f"0x40 stale _x5 0x{N}",
            progress=f"0+100x40 stale _x5 4700+100x{N}", up=f"1x40 0x6 1x{N}",
            kv=f"0.3x40 stale _x5 0.3x{N}", start_time=f"1000x40 stale _x5 1000x{N}",
        )
    )
    for at in ("10m15s", "11m", "12m", "13m", "15m", "17m", "20m", "40m"):
        s.silent(at, "LLMBackendStalled")
    for at in ("10m15s", "11m", "12m", "13m"):
        s.silent(at, "LLMBackendDown")
    s.expect("11m", "LLMBackendRestarted", {"backend": "mprestart"}, {"backend": "restart"})
    s.expect("15m", "LLMBackendRestarted", {"backend": "mprestart"}, {"backend": "restart"})
    s.silent("16m", "LLMBackendRestarted")
    s.silent("20m", "LLMBackendRestartLoop")
    s.silent("12m", "LLMMetricsBehindProxy")  # a real restart: start time goes up, never down
    s.state("20m", "prefill", 2)
    s.state("20m", "v0idle", 1)
    s.state("10m15s", "restart", 0)  # one failed scrape: unknown, not down
    s.state("12m", "restart", 3)
    s.state("10m30s", "shortgap", 0)
    s.state("20m", "gap", 2)
    return s


def restarts_and_proxies() -> Scenario:
    s = Scenario("restart loops; a target answered by two processes (behind a proxy)")
    s.add(
        vllm_backend(
            "loop", running=f"0x{N}", waiting=f"0x{N}", progress=f"0+10x{N}", up=f"1x{N}",
            start_time=seq(*(f"{1000 * (i + 1)}x39" for i in range(6)), f"9000x{N}"),
        )
    )
    s.add(
        vllm_backend(
            "mploop", running=f"0x{N}", waiting=f"0x{N}", up=f"1x{N}", start_time=None,
            progress=seq(*("1+10x39" for _ in range(6)), f"0+10x{N}"),
        )
    )
    # Two processes behind one address answer alternate scrapes.
    starts = " ".join("1000" if i % 2 == 0 else "2000" for i in range(N))
    counters = " ".join(str(50_000 + 40 * i) if i % 2 == 0 else str(300 + 40 * i) for i in range(N))
    s.add(
        vllm_backend(
            "proxied", running=f"2x{N}", waiting=f"0x{N}", progress=counters, up=f"1x{N}", start_time=starts,
            instance="lb.example:8000",
        )
    )
    s.silent("35m", "LLMBackendRestartLoop")  # 3 restarts in the hour: not more than 3
    s.expect("45m", "LLMBackendRestartLoop", {"backend": "loop", VALUE: 4}, {"backend": "mploop", VALUE: 4})
    s.expect("5m", "LLMMetricsBehindProxy", {"backend": "proxied", "instance": "lb.example:8000"})
    for at in ("5m", "30m", "45m"):
        s.silent(at, "LLMBackendStalled")
    s.expect("30m15s", "LLMBackendRestarted", {"backend": "loop"}, {"backend": "mploop"})
    s.silent("36m", "LLMBackendRestarted")
    s.state("5m", "proxied", 2)
    return s


def down_and_gone() -> Scenario:
    s = Scenario("down backends; every backend gone")
    # Idle (nothing in flight) at its last readings, then every scrape fails: down.
    s.add(vllm_backend("down", running="0x20 stale", waiting="0x20 stale", progress="10x20 stale", up=f"1x20 0x{N}",
                       kv="0.3x20 stale", start_time="1000x20 stale"))
    s.add(vllm_backend("expdown", running=f"0x{N}", waiting=f"0x{N}", progress=f"10x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "expdown"}, f"1x20 6x{N}"))
    # Busy, then its scrapes fail and the exporter's readings are refused (it crashed with work): the
    # exporter's down verdict still reaches LLMBackendDown.
    s.add(vllm_backend("busycrash", running="3x20 stale", waiting="1x20 stale", progress="0+100x20 stale",
                       up=f"1x20 0x{N}", kv="0.3x20 stale", start_time="1000x20 stale"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "busycrash"}, f"2x20 6x{N}"))
    s.add(series("up", EXPORTER, f"1x{N}"))
    s.silent("6m30s", "LLMBackendDown")
    s.expect("7m30s", "LLMBackendDown", {"backend": "down"}, {"backend": "expdown"}, {"backend": "busycrash"})
    s.state("6m", "down", 0)
    s.state("7m30s", "down", 6)
    s.silent("7m30s", "LLMBackendStalled")
    s.silent("7m30s", "LLMTooFewBackendsUp")
    s.silent("7m30s", "LLMHealthExporterDown")
    return s


def all_gone() -> Scenario:
    s = Scenario("all backends gone: scrape targets vanished, no up series at all")
    for b in ("a", "b"):
        s.add(vllm_backend(b, running="1x20 stale", waiting="0x20 stale", progress="0+10x20 stale", up="1x20 stale",
                           kv="0.3x20 stale", start_time="1000x20 stale"))
    s.silent("6m", "LLMTooFewBackendsUp")
    s.expect("8m", "LLMTooFewBackendsUp", {VALUE: 0})
    s.silent("8m", "LLMBackendDown")
    s.silent("8m", "LLMBackendStalled")
    s.silent("9m", "LLMBackendTargetMissing")
    s.expect("11m", "LLMBackendTargetMissing", {"backend": "a"}, {"backend": "b"})
    # The exporter is gone too (never scraped here).
    s.expect("11m", "LLMHealthExporterDown", {})
    return s


def all_down() -> Scenario:
    s = Scenario("all backends down: scraped, failing")
    for b in ("a", "b"):
        s.add(series("up", target_labels(b), "1x20 0x100"))
    s.expect("8m", "LLMTooFewBackendsUp", {VALUE: 0})
    s.expect("8m", "LLMBackendDown", {"backend": "a"}, {"backend": "b"})
    return s


def busy_timeouts() -> Scenario:
    """A busy vLLM's /metrics can time out (event-loop lag): failed scrapes after readings with work in
    flight are not "down" within the down-busy grace (10m); idle then failing is down after down_for."""
    s = Scenario("scrape failures of a busy backend are not down; of an idle one they are")
    s.add(vllm_backend("busytimeout", running="3x20 stale", waiting="2x20 stale", progress="0+100x20 stale",
                       up=f"1x20 0x{N}", kv="0.3x20 stale", start_time="1000x20 stale"))
    # Only waiting at its last reading (running can read 0 under load): still work in flight.
    s.add(vllm_backend("queuedtimeout", running="0x20 stale", waiting="4x20 stale", progress="0+100x20 stale",
                       up=f"1x20 0x{N}", kv="0.3x20 stale", start_time="1000x20 stale"))
    # Nothing in flight at any reading, then every scrape fails: down after down_for (2m).
    s.add(vllm_backend("idletimeout", running="0x20 stale", waiting="0x20 stale", progress="10x20 stale",
                       up=f"1x20 0x{N}", kv="0.3x20 stale", start_time="1000x20 stale"))
    for at in ("5m15s", "7m30s", "10m", "14m"):
        s.expect(at, "LLMBackendDown", *([{"backend": "idletimeout"}] if at != "5m15s" else []))
    s.state("7m30s", "busytimeout", 0)    # unknown, not down
    s.state("7m30s", "queuedtimeout", 0)
    s.state("7m30s", "idletimeout", 6)
    # Past the grace (10m after the last reading with work) the failures count again: a busy server that
    # died is reported by the rules alone too, late (the exporter's down verdict is the fast path).
    s.expect("16m", "LLMBackendDown", {"backend": "idletimeout"})
    s.expect("17m30s", "LLMBackendDown",
             {"backend": "busytimeout"}, {"backend": "queuedtimeout"}, {"backend": "idletimeout"})
    s.state("17m30s", "busytimeout", 6)
    s.silent("7m30s", "LLMBackendStalled")
    return s


def all_busy_unreachable() -> Scenario:
    s = Scenario("every backend busy, then every scrape fails: no per-backend Down, the fleet alert fires")
    for b in ("a", "b"):
        s.add(vllm_backend(b, running="5x20 stale", waiting="1x20 stale", progress="0+100x20 stale",
                           up=f"1x20 0x{N}", kv="0.3x20 stale", start_time="1000x20 stale"))
    s.silent("6m", "LLMTooFewBackendsUp")
    s.expect("8m", "LLMTooFewBackendsUp", {VALUE: 0})
    s.silent("8m", "LLMBackendDown")
    s.silent("12m", "LLMBackendDown")
    return s


def probes_sent() -> Scenario:
    """llm_health_probes_sent_total counts a probe when sent; llm_health_probes_total when it finishes."""
    s = Scenario("probes counted when sent; an idle moment between two scrapes of a bursty server")
    # Busy at every reading, the exporter read work at every scrape, and sent a probe at 30m: broken.
    s.add(vllm_backend("sentbusy", running=f"12x{N}", waiting=f"3x{N}", progress=f"0+300x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_probes_sent_total", {"backend": "sentbusy"}, "5x120 6x180"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "sentbusy", "result": "timeout"}, "5x124 6x176"))
    s.add(exporter_series("llm_health_in_flight_requests", {"backend": "sentbusy"}, f"15x{N}"))
    # Bursty: busy at every vLLM scrape, but the exporter read it idle (its gauge 0 at the 30m scrape)
    # and probed in that moment: excused.
    s.add(vllm_backend("sentgap", running=f"12x{N}", waiting=f"3x{N}", progress=f"0+300x{N}", up=f"1x{N}"))
    s.add(exporter_series("llm_health_probes_sent_total", {"backend": "sentgap"}, "5x120 6x180"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "sentgap", "result": "ok"}, "5x120 6x180"))
    s.add(exporter_series("llm_health_in_flight_requests", {"backend": "sentgap"}, f"15x119 0 15x{N}"))
    # Sent at 20m, in the one idle reading; it finished 30 s later, when the server was busy again. The
    # finish counter alone would look like a probe into a busy window; the sent counter does not.
    s.add(vllm_backend("latefinish", running="12x79 0 12x220", waiting="3x79 0 3x220", progress=f"0+300x{N}",
                       up=f"1x{N}"))
    s.add(exporter_series("llm_health_probes_sent_total", {"backend": "latefinish"}, "5x79 6x220"))
    s.add(exporter_series("llm_health_probes_total", {"backend": "latefinish", "result": "ok"}, "5x81 6x218"))
    s.add(exporter_series("llm_health_in_flight_requests", {"backend": "latefinish"}, f"15x{N}"))
    for at in ("21m", "23m", "25m15s", "29m"):
        s.silent(at, "LLMHealthProbeSentToBusyBackend")
    s.expect("30m15s", "LLMHealthProbeSentToBusyBackend", {"backend": "sentbusy"})
    s.expect("32m", "LLMHealthProbeSentToBusyBackend", {"backend": "sentbusy"})
    s.silent("36m", "LLMHealthProbeSentToBusyBackend")
    return s


def capacity() -> Scenario:
    s = Scenario("KV pressure (no double counting of the two KV names), preemptions, no metrics, unknown")
    s.add(vllm_backend("kvboth", running=f"4x{N}", waiting=f"0x{N}", progress=f"0+100x{N}", up=f"1x{N}", kv=f"0.92x{N}"))
    s.add(series("vllm:gpu_cache_usage_perc", vllm_labels("kvboth"), f"0.92x{N}"))
    s.add(vllm_backend("kvv0", v1=False, running=f"4x{N}", waiting=f"0x{N}", progress=f"0+100x{N}", up=f"1x{N}", kv=f"0.5x{N}"))
    s.add(vllm_backend("preempt", running=f"4x{N}", waiting=f"5x{N}", progress=f"0+100x{N}", up=f"1x{N}"))
    s.add(series("vllm:num_preemptions_total", vllm_labels("preempt"), f"0+1x{N}"))
    s.add(series("up", target_labels("nometrics"), f"1x{N}"))
    s.add(series("up", EXPORTER, f"1x{N}"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "unk"}, f"0x{N}"))
    s.add(exporter_series("llm_health_proxy_up", {"proxy": "lb"}, f"1x8 0x{N}"))
    s.value("1m", 'backend:vllm_kv_cache_usage:max{backend=~"kv.*"}', [
        ('backend:vllm_kv_cache_usage:max{backend="kvboth"}', 0.92),
        ('backend:vllm_kv_cache_usage:max{backend="kvv0"}', 0.5),
    ])
    s.silent("9m", "LLMKVCachePressure")
    # 92% on both names: one series, warning (over 90%) only; added up it would read 184%, critical
    s.expect("11m", "LLMKVCachePressure", {"backend": "kvboth", "severity": "warning", VALUE: 0.92})
    s.silent("9m", "LLMPreemptions")
    s.expect("12m", "LLMPreemptions", {"backend": "preempt", VALUE: 1 / 15})
    s.silent("4m", "LLMBackendNoMetrics")
    s.expect("6m", "LLMBackendNoMetrics", {"backend": "nometrics"})
    s.state("6m", "nometrics", 4)
    s.silent("9m", "LLMBackendVerdictUnknown")
    s.expect("11m", "LLMBackendVerdictUnknown", {"backend": "unk"})
    s.silent("3m", "LLMProxyDown")
    s.expect("5m", "LLMProxyDown", {"proxy": "lb"})
    s.silent("11m", "LLMHealthExporterDown")
    s.silent("11m", "LLMBackendStalled")
    return s


def exporter_down() -> Scenario:
    s = Scenario("exporter scraped and failing; exporter restarted verdict")
    s.add(series("up", EXPORTER, f"1x8 0x{N}"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "x"}, f"1x8 3 1x{N}"))
    s.silent("6m", "LLMHealthExporterDown")
    s.expect("7m30s", "LLMHealthExporterDown", EXPORTER)
    s.silent("2m", "LLMBackendRestarted")
    s.expect("2m15s", "LLMBackendRestarted", {"backend": "x"})
    s.silent("2m30s", "LLMBackendRestarted")
    return s


def error_rates() -> Scenario:
    """LLMBackendErrorRate: a signal only. Fires on a 5xx burst; silent without traffic, on 4xx, on a low
    share, and on 5xx of handlers that are not generation endpoints."""
    s = Scenario("5xx share of generation responses")
    # 10 ok/s throughout; from 5m on also 5 errors/s (a third of the responses).
    s.add(http_series("burst", "2xx", f"0+150x{N}"))
    s.add(http_series("burst", "5xx", f"0x20 0+75x{N}"))
    # Ungrouped status codes (should_group_status_codes=False) work the same way.
    s.add(http_series("raw", "200", f"0+150x{N}"))
    s.add(http_series("raw", "500", f"0x20 0+75x{N}"))
    # No traffic at all: 0/0, never "above the threshold". The 5xx series exists (errors long ago).
    s.add(http_series("quiet", "2xx", f"500x{N}"))
    s.add(http_series("quiet", "5xx", f"40x{N}"))
    # Only client errors, heavily.
    s.add(http_series("clienterr", "2xx", f"0+150x{N}"))
    s.add(http_series("clienterr", "4xx", f"0+150x{N}"))
    s.add(http_series("clienterr", "5xx", f"3x{N}"))
    # 1% errors: below the 5% default.
    s.add(http_series("lowshare", "2xx", f"0+1485x{N}"))
    s.add(http_series("lowshare", "5xx", f"0+15x{N}"))
    # 5xx only on a non-generation handler.
    s.add(http_series("models", "2xx", f"0+150x{N}"))
    s.add(http_series("models", "5xx", f"0+150x{N}", handler="/v1/models"))
    s.silent("5m", "LLMBackendErrorRate")
    s.silent("6m30s", "LLMBackendErrorRate")  # above the threshold, not yet for 2m
    s.expect("8m", "LLMBackendErrorRate", {"backend": "burst", VALUE: 1 / 3}, {"backend": "raw", VALUE: 1 / 3})
    s.expect("30m", "LLMBackendErrorRate", {"backend": "burst", VALUE: 1 / 3}, {"backend": "raw", VALUE: 1 / 3})
    return s


def other_engines() -> Scenario:
    """SGLang and llama.cpp, with the traps of their real pages: llama.cpp's generation-token counter moves
    only when a request finishes (n_decode_total is the step counter); SGLang's scheduler series repeat
    on every TP rank and carry dp_rank with several DP ranks; its tokenizer counters have no rank."""
    s = Scenario("SGLang and llama.cpp: busy, stalled per rank, restarted, down, their label traps")
    # SGLang, TP 2: every series twice (tp_rank 0 and 1). In flight is 4 + 2, not 12.
    s.add(sglang_backend("sgbusy", running=f"4x{N}", queue=f"2x{N}", up=f"1x{N}", passes=f"0+40x{N}",
                         tokens=f"0+300x{N}", tp_size=2))
    # SGLang frozen at 5m with work: per-rank passes and tokenizer counters stop.
    s.add(sglang_backend("sgstuck", running=f"3x{N}", queue=f"1x{N}", up=f"1x{N}", passes=f"0+40x20 800x{N}",
                         tokens=f"0+300x20 6000x{N}"))
    # DP 2: rank 0 serves, rank 1 wedges at 5m; the server-wide tokens keep moving (rank 0's work).
    s.add(sglang_backend("sgdp", running=f"2x{N}", queue=f"0x{N}", up=f"1x{N}", passes=f"0+40x{N}",
                         tokens=f"0+300x{N}", dp_rank="0"))
    s.add(sglang_backend("sgdp", running=f"2x{N}", queue=f"1x{N}", up=f"1x{N}", passes=f"0+40x20 800x{N}",
                         dp_rank="1", target=False))
    # DP 2 without a per-rank counter: the server-wide counters stand in for both ranks: busy, not stalled...
    s.add(sglang_backend("sgshared", running=f"2x{N}", queue=f"0x{N}", up=f"1x{N}", passes=None,
                         tokens=f"0+300x{N}", dp_rank="0"))
    s.add(sglang_backend("sgshared", running=f"2x{N}", queue=f"0x{N}", up=f"1x{N}", passes=None,
                         dp_rank="1", target=False))
    # ... and stalled when they stop too.
    s.add(sglang_backend("sgsharedstuck", running=f"2x{N}", queue=f"0x{N}", up=f"1x{N}", passes=None,
                         tokens=f"0+300x20 6000x{N}", dp_rank="0"))
    s.add(sglang_backend("sgsharedstuck", running=f"2x{N}", queue=f"0x{N}", up=f"1x{N}", passes=None,
                         dp_rank="1", target=False))
    # SGLang has no start time (always multiprocess): a restart at 10m shows as counters going back to 0.
    s.add(sglang_backend("sgrestart", running=f"2x{N}", queue=f"0x{N}", up=f"1x40 0 1x{N}",
                         passes=f"0+40x40 stale 0+40x{N}", tokens=f"0+300x40 stale 0+300x{N}"))
    # SGLang KV pool nearly full (token_usage), on both TP ranks.
    s.add(sglang_backend("sgkv", running=f"8x{N}", queue=f"0x{N}", up=f"1x{N}", passes=f"0+40x{N}",
                         tokens=f"0+300x{N}", usage=f"0.95x{N}", tp_size=2))
    # llama.cpp busy for the whole hour with one long request per slot: tokens_predicted never moves
    # (it is credited when a request finishes), n_decode_total moves every step: busy, never stalled.
    s.add(llamacpp_backend("lcbusy", processing=f"2x{N}", deferred=f"3x{N}", up=f"1x{N}", decodes=f"0+300x{N}",
                           predicted=f"0x{N}"))
    # llama.cpp with completions every 2.5 minutes: tokens_predicted moves in jumps, flat between.
    s.add(llamacpp_backend("lcjumps", processing=f"1x{N}", deferred=f"0x{N}", up=f"1x{N}", decodes=f"0+300x{N}",
                           predicted=" ".join(f"{500 * (i // 10)}" for i in range(N))))
    # llama.cpp frozen inside decode at 5m: every counter stops, requests_processing stays 1.
    s.add(llamacpp_backend("lcstuck", processing=f"1x{N}", deferred=f"2x{N}", up=f"1x{N}",
                           decodes=f"0+300x20 6000x{N}", predicted=f"0x10 500x{N}"))
    # llama.cpp restarts in 0.1 s: no failed scrape, no identity series, only the counters reset.
    s.add(llamacpp_backend("lcrestart", processing=f"1x{N}", deferred=f"0x{N}", up=f"1x{N}",
                           decodes=f"0+300x40 0+300x{N}", predicted=f"0+50x40 0+50x{N}"))
    # llama.cpp idle, then every scrape fails (killed): down.
    s.add(llamacpp_backend("lcdown", processing="0x20 stale", deferred="0x20 stale", up=f"1x20 0x{N}",
                           decodes="100x20 stale", predicted="100x20 stale"))
    s.add(llamacpp_backend("lcidle", processing=f"0x{N}", deferred=f"0x{N}", up=f"1x{N}", decodes=f"100x{N}",
                           predicted=f"100x{N}"))
    # Probes sent at 30m to engines busy at every reading: our principle broken, for any engine.
    for b, work in (("sgbusy", 6), ("lcbusy", 5)):
        s.add(exporter_series("llm_health_probes_sent_total", {"backend": b}, "5x120 6x180"))
        s.add(exporter_series("llm_health_in_flight_requests", {"backend": b}, f"{work}x{N}"))
    s.add(series("up", EXPORTER, f"1x{N}"))
    stuck = [{"backend": b} for b in ("sgstuck", "sgdp", "sgsharedstuck", "lcstuck")]
    s.silent("6m45s", "LLMBackendStalled")
    s.expect("7m15s", "LLMBackendStalled", *stuck)
    s.expect("8m30s", "LLMBackendStalled", *stuck)
    s.expect("30m", "LLMBackendStalled", *stuck)
    s.silent("6m30s", "LLMBackendDown")
    s.expect("7m30s", "LLMBackendDown", {"backend": "lcdown"})
    s.expect("11m", "LLMBackendRestarted", {"backend": "sgrestart"}, {"backend": "lcrestart"})
    s.silent("16m", "LLMBackendRestarted")
    s.silent("9m", "LLMKVCachePressure")
    s.expect("11m", "LLMKVCachePressure", {"backend": "sgkv", "severity": "warning", VALUE: 0.95})
    s.silent("29m", "LLMHealthProbeSentToBusyBackend")
    s.expect("32m", "LLMHealthProbeSentToBusyBackend", {"backend": "lcbusy"}, {"backend": "sgbusy"})
    for at in ("6m", "20m"):
        s.silent(at, "LLMBackendNoMetrics")
        s.silent(at, "LLMTooFewBackendsUp")
    for b, code in (("sgbusy", 2), ("sgshared", 2), ("sgstuck", 5), ("sgdp", 5), ("sgsharedstuck", 5),
                    ("lcbusy", 2), ("lcjumps", 2), ("lcstuck", 5), ("lcidle", 1), ("lcdown", 6)):
        s.state("20m", b, code)
    s.state("12m", "sgrestart", 3)
    s.state("12m", "lcrestart", 3)
    s.state("20m", "sgrestart", 2)
    for name, backend, value in (
        ("backend:llm_requests_in_flight:sum", "sgbusy", 6),
        ("backend:sglang_requests_in_flight:sum", "sgkv", 8),
        ("backend:llm_requests_in_flight:sum", "lcbusy", 5),
        ("backend:llamacpp_decode_steps:rate", "lcbusy", 20),
        ("backend:sglang_generation_tokens:rate", "sgbusy", 20),
        ("backend:llm_kv_cache_usage:max", "sgkv", 0.95),
    ):
        s.value("20m", f'{name}{{backend="{backend}"}}', [(f'{name}{{backend="{backend}"}}', value)])
    return s


def sglang_without_rank_labels() -> Scenario:
    """SGLang 0.4.x scheduler labels: model_name and engine_type only (no tp_rank, no dp_rank)."""
    s = Scenario("SGLang 0.4.x labels (no ranks): busy and stalled read the same")
    for b, passes in (("old", f"0+40x{N}"), ("oldstuck", f"0+40x20 800x{N}")):
        tl = {"job": "sglang", "backend": b, "instance": f"{b}.example:30000"}
        sl = {**tl, "model_name": "m", "engine_type": "unified"}
        s.add([series("up", tl, f"1x{N}"), series("sglang:num_running_reqs", sl, f"2x{N}"),
               series("sglang:num_queue_reqs", sl, f"1x{N}"), series("sglang:token_usage", sl, f"0.2x{N}"),
               series("sglang:generation_tokens_total", {**tl, "model_name": "m"}, passes)])
    s.expect("8m30s", "LLMBackendStalled", {"backend": "oldstuck"})
    s.state("20m", "old", 2)
    s.value("20m", 'backend:llm_requests_in_flight:sum{backend="old"}',
            [('backend:llm_requests_in_flight:sum{backend="old"}', 3)])
    return s


def sleep_and_long_steps() -> Scenario:
    s = Scenario("a vLLM asleep from 5m (sleep mode), a llama.cpp asleep per the exporter, and a long-step llama.cpp "
                 "whose counters freeze 4m per step (the exporter's bound 300 s) next to one that really stalls")
    vl = vllm_labels("asleep")
    s.add(vllm_backend("asleep", running=f"0x{N}", waiting=f"0x{N}", progress=f"0+10x20 200x{N}", up=f"1x{N}"))
    s.add(series("vllm:engine_sleep_state", {**vl, "sleep_state": "awake"}, f"1x20 0x{N}"))
    s.add(series("vllm:engine_sleep_state", {**vl, "sleep_state": "weights_offloaded"}, f"0x20 1x{N}"))
    s.add(series("vllm:engine_sleep_state", {**vl, "sleep_state": "discard_all"}, f"0x{N}"))
    # asleep with 2 requests queued for it (they wait for the wake-up): never a stall
    sq = vllm_labels("asleepq")
    s.add(vllm_backend("asleepq", running=f"0x{N}", waiting=f"2x{N}", progress=f"200x{N}", up=f"1x{N}"))
    s.add(series("vllm:engine_sleep_state", {**sq, "sleep_state": "awake"}, f"0x{N}"))
    s.add(series("vllm:engine_sleep_state", {**sq, "sleep_state": "discard_all"}, f"1x{N}"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "asleepq"}, f"7x{N}"))
    # one long llama.cpp prompt step: requests_processing 1, decode counter frozen 0..4m, then it moves
    long = {"job": "llamacpp", "backend": "longstep", "instance": "longstep.example:8080"}
    s.add(series("up", long, f"1x{N}"))
    s.add(series("llamacpp:requests_processing", long, f"1x{N}"))
    s.add(series("llamacpp:requests_deferred", long, f"0x{N}"))
    s.add(series("llamacpp:n_decode_total", long, f"5x16 6x{N}"))
    s.add(series("llamacpp:tokens_predicted_total", long, f"0x{N}"))
    s.add(series("llamacpp:prompt_tokens_total", long, f"0x{N}"))
    s.add(exporter_series("llm_health_stall_threshold_seconds", {"backend": "longstep"}, f"300x{N}"))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "longstep"}, f"0x{N}"))
    s.silent("2m", "LLMBackendStalled")
    s.silent("3m30s", "LLMBackendStalled")     # 3m30s frozen with work: longer than the rules' 2m window
    s.state("10m", "asleep", 7)
    s.state("10m", "asleepq", 7)
    s.silent("10m", "LLMBackendStalled")
    s.silent("10m", "LLMBackendDown")
    s.silent("30m", "LLMBackendStalled")
    s.value("10m", 'backend:llm_engine_sleeping:min{backend="asleep"}',
            [('backend:llm_engine_sleeping:min{backend="asleep"}', 1)])
    return s


REMEDIATOR = {"job": "llm-health-remediator", "instance": "rem-1:9411"}


def retired() -> Scenario:
    """An operator retired gpu-r (llm-health ctl retire) at 10m: from then on no alert about it fires and
    it counts toward no "too few backends"; gpu-s, the same story in service, alerts."""
    s = Scenario("a retired backend: stalled, still up; never alerted, never counted")
    for b, up in (("gpu-r", f"1x{N}"), ("gpu-s", f"1x80 0x{N}")):
        # work in flight, progress until 1m, then frozen; from 20m gpu-s fails every scrape, gpu-r answers
        s.add(vllm_backend(b, running="3x80 stale", waiting="0x80 stale", progress="0+100x4 500x76 stale",
                           up=up, kv="0.3x80 stale", start_time="1000x80 stale"))
    s.add(series("llm_health_remediator_admin_state", {**REMEDIATOR, "backend": "gpu-r", "state": "retired"},
                  f"0x40 1x{N}"))
    s.add(series("llm_health_remediator_admin_state", {**REMEDIATOR, "backend": "gpu-s", "state": "retired"},
                  f"0x{N}"))
    s.expect("6m", "LLMBackendStalled", {"backend": "gpu-r"}, {"backend": "gpu-s"})   # before the retire
    s.expect("12m", "LLMBackendStalled", {"backend": "gpu-s"})
    s.silent("12m", "LLMTooFewBackendsUp")           # gpu-s is up: one in service, enough
    s.expect("25m", "LLMTooFewBackendsUp", {VALUE: 0})   # gpu-s down; the retired gpu-r, up, is not counted
    s.expect("35m", "LLMBackendDown", {"backend": "gpu-s"})   # after the down-busy grace
    s.value("12m", "backend:llm_retired:bool", [('backend:llm_retired:bool{backend="gpu-r"}', 1)])
    return s


# --- saturation and latency: signals, never restarts --------------------------------------------------

def latency(backend: str, metric: str, segments: list[tuple[int, float, float]], **kw: object) -> list[dict[str, str]]:
    """A vLLM histogram of `backend` (series labels as vllm_backend's)."""
    return histogram_series(metric, vllm_labels(backend), segments, **kw)  # type: ignore[arg-type]


def busy(backend: str, *, waiting: str = f"0x{N}", running: str = f"4x{N}", n: int = N, **kw: object) -> list[dict[str, str]]:
    """A vLLM target serving steadily (its counters move: never stalled)."""
    return vllm_backend(backend, running=running, waiting=waiting, progress=f"0+100x{n}", up=f"1x{n}",
                        **kw)  # type: ignore[arg-type]


def saturation() -> Scenario:
    """Queue depth, mean queue time (also when the queue stands still), TTFT p99 at both levels, the TTFT
    SLO over 1h, admission stalled per engine, KV at both levels; the traps stay silent: short spikes
    under `for`, idle backends, a sleeping and a retired backend, a brief burst inside the SLO's hour."""
    s = Scenario("saturation and latency signals: queue, queue time, TTFT, SLO, admission, KV levels")
    s.add(busy("deepq", waiting=f"60x{N}", running=f"8x{N}"))
    s.add(busy("qspike", waiting=f"60x16 5x{N}", running=f"8x{N}"))          # 4 minutes above 50
    q = "vllm:request_queue_time_seconds"
    s.add(busy("slowq", waiting=f"5x{N}"))
    s.add(latency("slowq", q, [(N, 1, 40.0)], buckets=None))                   # every request queued 40 s
    s.add(busy("fastq", waiting=f"5x{N}"))
    s.add(latency("fastq", q, [(N, 1, 2.0)], buckets=None))
    # requests finish with 1 s of queue time for 20 minutes, then none finishes while 5 keep waiting: the
    # mean is 0/0 (empty) exactly when the queue stands still; the alert must not go quiet then
    s.add(busy("frozenq", waiting=f"5x{N}", running=f"1x{N}"))
    s.add(latency("frozenq", q, [(80, 1, 1.0), (N - 80, 0, 0.0)], buckets=None))
    s.add(busy("idleq", waiting=f"0x{N}", running=f"0x{N}"))                   # the same counters, no queue
    s.add(latency("idleq", q, [(80, 1, 1.0), (N - 80, 0, 0.0)], buckets=None))
    t = "vllm:time_to_first_token_seconds"
    s.add(busy("slowttft"))
    s.add(latency("slowttft", t, [(N, 1, 12.0)]))                              # p99 19.9 s: warning only
    s.add(busy("veryslowttft"))
    s.add(latency("veryslowttft", t, [(N, 1, 35.0)]))                          # p99 39.8 s: both levels
    s.add(busy("ttftspike"))
    s.add(latency("ttftspike", t, [(20, 1, 0.3), (4, 1, 12.0), (N - 24, 1, 0.3)]))  # one minute of 12 s
    s.add(busy("sloburn"))
    s.add(latency("sloburn", t, [(N, 1, 4.0)]))                                # p95 4.875 s > 3 s
    s.add(busy("sloblip"))
    s.add(latency("sloblip", t, [(40, 1, 0.3), (8, 1, 4.0), (N - 48, 1, 0.3)]))  # 2 minutes of 4 s in the hour
    s.add(busy("ttftidle"))
    s.add(latency("ttftidle", t, [(N, 0, 0.0)]))                               # no request at all
    # admission: waiting, none running (a scheduler that steps but admits nothing: a counter moves)
    s.add(busy("admit", waiting=f"3x{N}", running=f"0x{N}"))
    s.add(busy("admitblip", waiting=f"3x{N}", running=f"0x16 1x{N}"))          # 4 minutes, then one runs
    s.add(sglang_backend("sgadmit", running=f"0x{N}", queue=f"3x{N}", up=f"1x{N}", passes=f"0+40x{N}", tp_size=2))
    s.add(llamacpp_backend("lcadmit", processing=f"0x{N}", deferred=f"2x{N}", up=f"1x{N}", decodes=f"0+300x{N}",
                           predicted=f"0x{N}"))
    s.add(busy("admitretired", waiting=f"3x{N}", running=f"0x{N}"))
    s.add(series("llm_health_remediator_admin_state", {**REMEDIATOR, "backend": "admitretired", "state": "retired"},
                 f"1x{N}"))
    asleep = vllm_labels("admitasleep")
    s.add(busy("admitasleep", waiting=f"2x{N}", running=f"0x{N}"))
    s.add(series("vllm:engine_sleep_state", {**asleep, "sleep_state": "awake"}, f"0x{N}"))
    # KV: 92% (warning after 10m), 97% (critical after 5m, warning too after 10m), 97% for 3 minutes
    s.add(busy("kvwarn", kv=f"0.92x{N}"))
    s.add(busy("kvfull", kv=f"0.97x{N}"))
    s.add(busy("kvspike", kv=f"0.97x12 0.5x{N}"))
    s.add(series("up", EXPORTER, f"1x{N}"))

    s.silent("4m30s", "LLMQueueDepthHigh")
    s.expect("6m", "LLMQueueDepthHigh", {"backend": "deepq", VALUE: 60})
    s.expect("20m", "LLMQueueDepthHigh", {"backend": "deepq", VALUE: 60})
    s.silent("5m", "LLMQueueTimeHigh")
    s.expect("6m", "LLMQueueTimeHigh", {"backend": "slowq", VALUE: 40})
    s.expect("34m", "LLMQueueTimeHigh", {"backend": "slowq", VALUE: 40})        # frozenq: 1 s until 35m
    s.expect("41m", "LLMQueueTimeHigh", {"backend": "frozenq", VALUE: 900}, {"backend": "slowq", VALUE: 40})
    s.expect("70m", "LLMQueueTimeHigh", {"backend": "frozenq", VALUE: 900}, {"backend": "slowq", VALUE: 40})
    s.value("30m", 'backend:llm_queue_time_seconds:mean_queue_time_window{backend=~"fastq|frozenq|idleq"}',
            [('backend:llm_queue_time_seconds:mean_queue_time_window{backend="fastq"}', 2),
             ('backend:llm_queue_time_seconds:mean_queue_time_window{backend="frozenq"}', 1),
             ('backend:llm_queue_time_seconds:mean_queue_time_window{backend="idleq"}', 1)])
    s.value("40m", 'backend:llm_queue_time_seconds:mean_queue_time_window{backend=~"frozenq|idleq"}', [])
    s.silent("5m", "LLMTimeToFirstTokenHigh")
    s.expect("6m", "LLMTimeToFirstTokenHigh", {"backend": "veryslowttft", "severity": "critical", VALUE: 39.8})
    s.expect("11m", "LLMTimeToFirstTokenHigh",
             {"backend": "slowttft", "severity": "warning", VALUE: 19.9},
             {"backend": "veryslowttft", "severity": "warning", VALUE: 39.8},
             {"backend": "veryslowttft", "severity": "critical", VALUE: 39.8})
    # the spike is above the warning threshold for ~6 minutes (its minute plus the 5m window): under `for`
    s.value("10m", 'backend:llm_time_to_first_token_seconds:p99{backend="ttftspike"} > bool 10',
            [('{backend="ttftspike"}', 1)])
    s.expect("12m", "LLMTimeToFirstTokenHigh",
             {"backend": "slowttft", "severity": "warning", VALUE: 19.9},
             {"backend": "veryslowttft", "severity": "warning", VALUE: 39.8},
             {"backend": "veryslowttft", "severity": "critical", VALUE: 39.8})
    s.value("20m", 'backend:llm_time_to_first_token_seconds:p95{backend=~"slowttft|ttftidle"}',
            [('backend:llm_time_to_first_token_seconds:p95{backend="slowttft"}', 19.5)])
    s.value("20m", 'backend_model:llm_time_to_first_token_seconds:p95{backend="slowttft"}',
            [('backend_model:llm_time_to_first_token_seconds:p95{backend="slowttft", model_name="m"}', 19.5)])
    s.silent("15m", "LLMTimeToFirstTokenSLOBreach")
    s.expect("16m", "LLMTimeToFirstTokenSLOBreach",
             {"backend": "sloburn", VALUE: 4.875}, {"backend": "slowttft", VALUE: 19.5},
             {"backend": "veryslowttft", VALUE: 39})
    s.expect("60m", "LLMTimeToFirstTokenSLOBreach",
             {"backend": "sloburn", VALUE: 4.875}, {"backend": "slowttft", VALUE: 19.5},
             {"backend": "veryslowttft", VALUE: 39})
    s.silent("4m30s", "LLMBackendAdmissionStalled")
    s.expect("6m", "LLMBackendAdmissionStalled",
             {"backend": "admit", VALUE: 3}, {"backend": "sgadmit", VALUE: 3}, {"backend": "lcadmit", VALUE: 2})
    s.expect("30m", "LLMBackendAdmissionStalled",
             {"backend": "admit", VALUE: 3}, {"backend": "sgadmit", VALUE: 3}, {"backend": "lcadmit", VALUE: 2})
    s.silent("4m30s", "LLMKVCachePressure")
    s.expect("6m", "LLMKVCachePressure", {"backend": "kvfull", "severity": "critical", VALUE: 0.97})
    s.expect("11m", "LLMKVCachePressure",
             {"backend": "kvwarn", "severity": "warning", VALUE: 0.92},
             {"backend": "kvfull", "severity": "warning", VALUE: 0.97},
             {"backend": "kvfull", "severity": "critical", VALUE: 0.97})
    for at in ("6m", "30m"):
        s.silent(at, "LLMBackendStalled")
    s.value("20m", 'backend:llm_requests_waiting:sum{backend=~"deepq|sgadmit|lcadmit"}',
            [('backend:llm_requests_waiting:sum{backend="deepq"}', 60),
             ('backend:llm_requests_waiting:sum{backend="lcadmit"}', 2),
             ('backend:llm_requests_waiting:sum{backend="sgadmit"}', 3)])   # tp_rank 0 only: not 6
    s.value("20m", 'backend_model:llm_requests_waiting:sum{backend="deepq"}',
            [('backend_model:llm_requests_waiting:sum{backend="deepq", model_name="m"}', 60)])
    return s


def sglang_and_llamacpp_latency() -> Scenario:
    """SGLang's latency histograms (tokenizer side, its queue time per TP rank: read rank 0 only) and
    llama.cpp's mean time per predicted token from its two counters."""
    s = Scenario("SGLang latency histograms and llama.cpp's predict time: the records per backend and model")
    s.add(sglang_backend("sglat", running=f"4x{N}", queue=f"1x{N}", up=f"1x{N}", passes=f"0+40x{N}", tp_size=2))
    tok = {"job": "sglang", "backend": "sglat", "instance": "sglat.example:30000", "model_name": "m"}
    s.add(histogram_series("sglang:time_to_first_token_seconds", {**tok, "engine_type": "unified"}, [(N, 1, 12.0)]))
    s.add(histogram_series("sglang:inter_token_latency_seconds", tok, [(N, 50, 0.04)]))
    s.add(histogram_series("sglang:e2e_request_latency_seconds", tok, [(N, 1, 30.0)]))
    for rank in ("0", "1"):        # every TP rank observes it: the mean must not change, the rate not double
        sl = {**tok, "engine_type": "unified", "tp_rank": rank, "pp_rank": "0", "moe_ep_rank": "0"}
        s.add(histogram_series("sglang:queue_time_seconds", sl, [(N, 1, 45.0 if rank == "0" else 1.0)],
                               buckets=None))
    lc = {"job": "llamacpp", "backend": "lclat", "instance": "lclat.example:8080"}
    s.add(llamacpp_backend("lclat", processing=f"1x{N}", deferred=f"0x{N}", up=f"1x{N}", decodes=f"0+300x{N}",
                           predicted=f"0+20x{N}"))
    s.add(series("llamacpp:tokens_predicted_seconds_total", lc, f"0+1x{N}"))      # 50 ms per token
    s.add(series("up", EXPORTER, f"1x{N}"))
    for name, backend, value in (
        ("backend:llm_time_to_first_token_seconds:p99", "sglat", 19.9),
        ("backend:llm_e2e_request_latency_seconds:p95", "sglat", 39),
        ("backend:llm_inter_token_latency_seconds:p95", "sglat", 0.0488),
        ("backend:llm_inter_token_latency_seconds:mean", "sglat", 0.04),
        ("backend:llm_queue_time_seconds:mean_queue_time_window", "sglat", 45),
        ("backend:llm_inter_token_latency_seconds:mean", "lclat", 0.05),
        ("backend:llm_inter_token_latency_seconds:mean_degraded_window", "lclat", 0.05),
    ):
        query = f'{name}{{backend="{backend}"}}'
        s.value("20m", f"round({query}, 0.0001)", [(f'{{backend="{backend}"}}', value)])
    s.value("20m", 'round(backend_model:llm_inter_token_latency_seconds:mean{backend=~"sglat|lclat"}, 0.0001)',
            [('{backend="lclat"}', 0.05), ('{backend="sglat", model_name="m"}', 0.04)])
    s.expect("11m", "LLMTimeToFirstTokenHigh", {"backend": "sglat", "severity": "warning", VALUE: 19.9})
    s.expect("6m", "LLMQueueTimeHigh", {"backend": "sglat", VALUE: 45})
    s.silent("30m", "LLMBackendAdmissionStalled")
    s.silent("30m", "LLMBackendDegraded")
    return s


DEGRADED_N = 900   # 3h45m at 15 s


def degraded() -> Scenario:
    """LLMBackendDegraded: slower than the backend's own history (docs/runbooks.md). Inter-token latency
    31 ms at 100 tokens per scrape interval; "latched" at 62 ms (half speed, 50 tokens) from 2h on, until
    the end (the report: until the pod restarted). Must not fire: steady, idle, a fresh backend without a
    baseline, a trickle of traffic, a slowdown shorter than `for`."""
    n = DEGRADED_N
    s = Scenario("decode latched at half speed: degraded against its own baseline; the traps stay silent", )
    itl = "vllm:inter_token_latency_seconds"
    normal, slow = (1, 100, 0.031), (1, 50, 0.062)

    def backend(name: str, segments: list[tuple[int, float, float]], start: int = 0) -> None:
        up = f"_x{start} 1x{n - start}" if start else f"1x{n}"
        s.add(vllm_backend(name, running=up.replace("1x", "4x"), waiting=up.replace("1x", "0x"),
                           progress=f"_x{start} 0+100x{n - start}" if start else f"0+100x{n}", up=up,
                           kv=up.replace("1x", "0.3x"), start_time=up.replace("1x", "1000x")))
        s.add(histogram_series(itl, vllm_labels(name), segments, start=start, buckets=None))

    backend("latched", [(480, *normal[1:]), (n - 480, *slow[1:])])
    backend("steady", [(n, *normal[1:])])
    backend("idlebase", [(480, *normal[1:]), (n - 480, 0, 0.0)])                  # no traffic from 2h
    backend("fresh", [(20, *normal[1:]), (n - 500, *slow[1:])], start=480)        # born at 2h: no baseline
    backend("trickle", [(480, *normal[1:]), (n - 480, 0.5, 0.062)])               # 60 tokens per 30m
    backend("blip", [(480, *normal[1:]), (140, *slow[1:]), (n - 620, *normal[1:])])  # 35 minutes slow
    s.add(series("up", EXPORTER, f"1x{n}"))
    s.silent("2h", "LLMBackendDegraded")
    s.silent("2h40m", "LLMBackendDegraded")          # above 1.8x since 2h26m40s: not yet 15m
    s.expect("2h45m", "LLMBackendDegraded", {"backend": "latched", VALUE: 2})
    s.expect("3h30m", "LLMBackendDegraded", {"backend": "latched", VALUE: 2})   # the median keeps the baseline
    s.value("3h30m", 'round(backend:llm_inter_token_latency_seconds:baseline{backend=~"latched|steady"}, 0.0001)',
            [('{backend="latched"}', 0.031), ('{backend="steady"}', 0.031)])
    s.value("2h50m", 'backend:llm_inter_token_latency_seconds:baseline{backend="fresh"}', [])   # 20m of history
    s.value("3h", 'backend:llm_inter_token_latency_seconds:mean_degraded_window{backend="idlebase"}', [])
    for at in ("1h", "2h"):
        s.silent(at, "LLMBackendStalled")
    return s


SCENARIOS = [sleep_and_long_steps, other_engines, sglang_without_rank_labels, busy_and_probes, stalls, traps, restarts_and_proxies, down_and_gone, all_gone, all_down, capacity, exporter_down,
             busy_timeouts, all_busy_unreachable, probes_sent, error_rates, error_rate_quiet, retired,
             saturation, sglang_and_llamacpp_latency, degraded]


def build_document(rule_files: list[Path] | None = None, written_as: list[str] | None = None) -> dict:
    return promtool_document([make() for make in SCENARIOS], rule_files, written_as=written_as)


def test_checked_in_promtool_file_is_current() -> None:
    relative = [f"../{p.name}" for p in RULE_FILES]
    text = yaml.safe_dump(build_document(written_as=relative), sort_keys=False, width=200)
    header = "# Generated by tests/rules/test_promtool.py; run: promtool test rules rules/tests/llm_health_test.yml\n"
    if os.environ.get("LLM_HEALTH_UPDATE_RULE_TESTS"):
        CHECKED_IN.parent.mkdir(parents=True, exist_ok=True)
        CHECKED_IN.write_text(header + text)
    assert CHECKED_IN.exists() and CHECKED_IN.read_text() == header + text, (
        "rules/tests/llm_health_test.yml is stale: LLM_HEALTH_UPDATE_RULE_TESTS=1 pytest tests/rules/test_promtool.py"
    )


def test_promtool_scenarios_pass(tmp_path: Path) -> None:
    result = run_promtool_tests(build_document(), tmp_path / "llm_health_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_case_and_a_trap() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for make in SCENARIOS:
        for case in make().alerts:  # exp_alerts: the expected label sets
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    names = set(alert_rules())
    assert names - fires == set(), f"alerts never shown firing: {sorted(names - fires)}"
    assert names - silent == set(), f"alerts never shown silent: {sorted(names - silent)}"
    # every level of a two-level alert fires somewhere
    levels = {(r["alert"], r["labels"]["severity"]) for r in alert_rule_list()}
    shown = {(case["alertname"], labels.get("severity", "warning")) for make in SCENARIOS
             for case in make().alerts for labels in case["exp_alerts"]}
    assert {lv for lv in levels if lv[0] in TIERED_ALERTS} - shown == set()
    assert TIERED_ALERTS and all(len(levels & {(a, t) for t in tiers}) == len(tiers) for a, tiers in TIERED_ALERTS.items())


def test_saturation_signals_never_carry_a_restart_label() -> None:
    """The saturation and latency alerts are signals: no remediation label on any of their levels, so no
    route of deploy/alertmanager sends them to the remediator (tests/rules/test_bundle.py, amtool)."""
    signals = {"LLMQueueDepthHigh", "LLMQueueTimeHigh", "LLMTimeToFirstTokenHigh", "LLMTimeToFirstTokenSLOBreach",
               "LLMBackendAdmissionStalled", "LLMBackendDegraded", "LLMKVCachePressure"}
    rules = [r for r in alert_rule_list() if r["alert"] in signals]
    assert {r["alert"] for r in rules} == signals
    assert all("remediation" not in r["labels"] for r in rules)


def test_promtool_reports_a_wrong_expectation(tmp_path: Path) -> None:
    """The harness can fail: the busy hour must not be called stalled."""
    s = Scenario("deliberately wrong")
    s.add(vllm_backend("busy", running="12x40", waiting="0x40", progress="0+300x40", up="1x40"))
    s.expect("8m", "LLMBackendStalled", {"backend": "busy"})
    result = run_promtool_tests(promtool_document([s]), tmp_path / "wrong.yml")
    assert result.returncode == 1
    assert "LLMBackendStalled" in result.stderr + result.stdout


def test_rules_only_render_keeps_the_vllm_verdicts(tmp_path: Path) -> None:
    """`--without-exporter`: for operators who only scrape vLLM. Same verdicts from counters alone."""
    from llm_health.render.rules import RuleSettings, write_rendered

    files = [p for p in write_rendered(tmp_path, RuleSettings(exporter=False)) if p.name != "llm_health_self.yml"]
    assert not any("llm_health_" in e.replace("backend:llm_health_state", "") for e in
                   [r["expr"] for r in alert_rules(files).values()])
    assert {"LLMHealthExporterDown", "LLMProxyDown", "LLMHealthProbeSentToBusyBackend"}.isdisjoint(alert_rules(files))
    scenarios = [traps(), restarts_and_proxies(), all_down(), busy_timeouts(), all_busy_unreachable()]
    result = run_promtool_tests(promtool_document(scenarios, files), tmp_path / "rules_only_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_rendered_for_a_1m_scrape_interval_see_rates(tmp_path: Path) -> None:
    """Prometheus' default 1m scrape: with --scrape-interval 1m the derived windows (rate 4m, stall 4m)
    hold enough samples that preemptions fire, tokens/s has a value, and a frozen backend is stalled."""
    from llm_health.render.rules import RuleSettings, write_rendered

    files = write_rendered(tmp_path, RuleSettings(scrape_interval="1m"))
    n = 60
    s = Scenario("1m scrape interval", interval="1m")
    s.add(vllm_backend("preempt", running=f"4x{n}", waiting=f"5x{n}", progress=f"0+600x{n}", up=f"1x{n}",
                       kv=f"0.3x{n}", start_time=f"1000x{n}"))
    s.add(series("vllm:num_preemptions_total", vllm_labels("preempt"), f"0+6x{n}"))
    s.add(vllm_backend("frozen", running=f"3x{n}", waiting=f"1x{n}", progress=f"0+600x5 3600x{n}", up=f"1x{n}",
                       kv=f"0.3x{n}", start_time=f"1000x{n}"))
    s.value("20m", 'backend:vllm_generation_tokens:rate{backend="preempt"}',
            [('backend:vllm_generation_tokens:rate{backend="preempt"}', 10)])
    s.value("20m", 'backend:vllm_num_preemptions:rate{backend="preempt"}',
            [('backend:vllm_num_preemptions:rate{backend="preempt"}', 0.1)])
    s.silent("9m", "LLMPreemptions")
    s.expect("20m", "LLMPreemptions", {"backend": "preempt", VALUE: 0.1})
    s.silent("7m", "LLMBackendStalled")
    s.expect("20m", "LLMBackendStalled", {"backend": "frozen"})
    s.state("20m", "preempt", 2)
    s.state("20m", "frozen", 5)
    result = run_promtool_tests(promtool_document([s], files), tmp_path / "scrape_1m_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
