"""Acceptance: `llm-health exporter` and `llm-health check` against real simulator processes.

Everything runs on 127.0.0.1 with free ports; processes are stopped by the fixture even on failure.
Small intervals (0.3 s) and grace periods (2 s) keep the suite short; every wait is a deadline poll.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import free_port, llm_health, wait_until
from llm_health.exporter.check import verify
from llm_health.httpserver import QuietHandler
from tests.support.loopback import Loopback
from tests.support.simrig import INTERVAL, STALL_AFTER, Exporter, Sim  # noqa: F401 - the sim and exporter fixtures: conftest


class Load:
    """`n` concurrent long completions (plain clients, not probes); they end when the sim stops."""

    def __init__(self, url: str, n: int, max_tokens: int = 4000) -> None:
        self.threads = [threading.Thread(target=self._one, args=(url, max_tokens), daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    @staticmethod
    def _one(url: str, max_tokens: int) -> None:
        try:
            requests.post(url + "/v1/completions", json={"model": "sim-model", "prompt": "work " * 20,
                                                         "max_tokens": max_tokens}, timeout=120)
        except requests.RequestException:
            pass


def watch(exporter: Exporter, name: str, until: Callable[[], bool], timeout: float) -> list[str]:
    """Poll the verdict of `name` until `until()` holds; return every verdict seen meanwhile."""
    seen: list[str] = []

    def done() -> bool:
        seen.append(exporter.verdict(name))
        return until()

    wait_until(done, timeout=timeout, interval=0.03, what="watch condition")
    return seen


# ------------------------------------------------------------------------------------ idle / busy


def test_idle_backend_gets_one_probe_per_interval_and_it_is_counted(sim, exporter) -> None:
    s = sim()
    e = exporter({"a": s.url})
    b = e.wait_verdict("a", "idle")
    wait_until(lambda: "probe answered" in e.backend("a")["reason"], timeout=10, what="probe answered")
    stats = s.stats()
    assert stats["by_kind"]["probe"] >= 1 and stats["probes_while_busy"] == 0
    assert stats["by_kind"]["generation"] == 0
    text = e.metrics()
    for verdict in ("unknown", "idle", "busy", "restarted", "no_metrics", "stalled", "down"):
        value = "1.0" if verdict == "idle" else "0.0"
        assert f'llm_health_verdict{{backend="a",verdict="{verdict}"}} {value}' in text
    assert 'llm_health_verdict_code{backend="a"} 1.0' in text
    assert 'llm_health_readings_total{backend="a",result="ok"}' in text
    assert "llm_health_schedule_lag_seconds " in text
    assert 'llm_health_readings_skipped_total{backend="a"} 0.0' in text
    assert 'llm_health_reading_duration_seconds{backend="a"}' in text
    # every probe the simulator saw was counted by the exporter (none in flight at a quiet moment)
    e.proc.stop()
    counted = [line for line in text.splitlines() if line.startswith('llm_health_probes_total{backend="a",result="ok"}')]
    assert counted and float(counted[0].split()[-1]) >= 1
    assert b["in_flight"] == 0


def test_busy_with_every_slot_full_is_never_probed(sim, exporter) -> None:
    s = sim("--max-num-seqs", 12)
    Load(s.url, 14)
    last: dict[str, Any] = {}

    def full() -> bool:
        last.update(s.stats())
        return last["running"] == 12 and last["waiting"] == 2

    try:
        wait_until(full, timeout=20, what="12 of 12 running")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last}") from None
    e = exporter({"a": s.url})
    b = e.wait_verdict("a", "busy")
    assert b["in_flight"] == 14 and b["tokens_per_second"] > 0
    assert "12 running, 2 waiting" in b["reason"]
    e.wait_cycles(10)
    assert e.verdict("a") == "busy"
    stats = s.stats()
    assert stats["running"] == 12  # still full: the whole test was busy
    assert stats["by_kind"]["probe"] == 0 and stats["probes"] == 0 and stats["probes_while_busy"] == 0
    assert 'llm_health_probes_total{backend="a",result="ok"} 0.0' in e.metrics()


# ------------------------------------------------------------------------------------ stalled


def test_stalled_is_detected_after_stall_after_and_not_before(sim, exporter) -> None:
    s = sim()
    Load(s.url, 3)
    e = exporter({"a": s.url})
    e.wait_verdict("a", "busy")
    s.fault("stall")
    t0 = time.monotonic()
    seen = watch(e, "a", lambda: e.verdict("a") == "stalled", timeout=STALL_AFTER + 2 * INTERVAL + 1.5)
    elapsed = time.monotonic() - t0
    assert elapsed >= STALL_AFTER - INTERVAL, f"stalled too early ({elapsed:.2f} s): {seen}"
    assert "down" not in seen
    b = e.backend("a")
    assert b["reason"].startswith("3 running, 0 waiting, no engine progress for")
    assert s.stats()["probes"] == 0
    # the engine moves again: busy again
    s.fault("none")
    e.wait_verdict("a", "busy")


def test_a_stalled_backends_frozen_counters_are_published_and_a_verification_reuses_them(sim, exporter) -> None:
    """Issue 25: /verdicts?backend= shows the signature of the frozen counters and for how long they stood
    still; the remediator's verification (remediator/backend_io.py frozen_evidence) reads it, and one fresh
    look that shows the same counters is enough."""
    from llm_health.config import Backend
    from llm_health.exporter.backend import Target, observe
    from llm_health.exporter.verdict import progress_signature
    from llm_health.remediator.backend_io import frozen_evidence

    s, other = sim(), sim()
    Load(s.url, 3)
    e = exporter({"a": s.url, "b": other.url})
    e.wait_verdict("a", "busy")
    assert "progress_signature" not in e.backend("a")          # only a stalled backend has one
    s.fault("stall")
    e.wait_verdict("a", "stalled", timeout=STALL_AFTER + 4 * INTERVAL + 5)
    doc = requests.get(e.url + "/verdicts", params={"backend": "a"}, timeout=5).json()
    assert [b["backend"] for b in doc["backends"]] == ["a"]
    row = doc["backends"][0]
    target = Target(s.url, 2.0)
    try:
        fresh = observe(target).reading
    finally:
        target.close()
    assert fresh is not None and row["progress_signature"] == progress_signature(fresh)
    assert row["frozen_for_seconds"] >= STALL_AFTER - INTERVAL
    assert row["page_is_work_queue"] is False                 # vLLM: its page is not its loop's own work
    evidence = frozen_evidence(e.url, Backend("a", s.url))
    assert evidence is not None and evidence.signature == row["progress_signature"]
    assert evidence.page_is_work_queue is False
    assert frozen_evidence(e.url, Backend("b", other.url)) is None       # not stalled: nothing to reuse
    v = verify(s.url, readings=2, interval=0.2, read_timeout=2, probe_timeout=2, evidence=evidence)
    assert v.outcome == "no_progress" and "the very counters the exporter saw frozen" in v.reason
    assert frozen_evidence("http://127.0.0.1:9", Backend("a", s.url), timeout=1.0) is None   # no exporter


def test_an_idle_engine_that_froze_gets_one_probe_not_one_per_interval(sim, exporter) -> None:
    """The probe that timed out stays in a wedged engine's queue (it takes no abort); before, a new probe
    joined it every interval until the restart. Now: one probe, then down because the engine has not moved."""
    s = sim()
    e = exporter({"a": s.url})
    wait_until(lambda: s.stats()["probes"] >= 1 and e.verdict("a") == "idle", timeout=10, what="idle, probed")
    s.fault("stall")
    sent = s.stats()["probes"]
    e.wait_verdict("a", "down", timeout=20)
    down_at = e.backend("a")["readings"]["ok"]
    wait_until(lambda: e.backend("a")["readings"]["ok"] >= down_at + 10, timeout=20, what="ten more readings")
    assert e.verdict("a") == "down"
    assert s.stats()["probes"] - sent <= 2, s.stats()      # the one in flight at the stall, and at most one after
    assert "not probed again" in e.backend("a")["reason"] or "down until a probe answers" in e.backend("a")["reason"]


# ------------------------------------------------------------------------------------ restarted


@pytest.mark.parametrize("mode", [(), ("--multiprocess",)], ids=["single-process", "multiprocess"])
def test_restart_is_seen_and_counters_are_not_compared(sim, exporter, mode: tuple[str, ...]) -> None:
    s = sim(*mode, "--restart-seconds", 0.0)
    for _ in range(2):  # some counters > 0, so a reset is visible even without a start time
        requests.post(s.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 5},
                      timeout=10)
    e = exporter({"a": s.url})
    e.wait_verdict("a", "idle")
    if mode:
        r = s.reading()
        assert r.process_start is None and not r.created
    s.fault("restart", 0.0)
    b = e.wait_verdict("a", "restarted")
    assert "another process answered" in b["reason"]
    if mode:
        assert "went backwards" in b["reason"]
    e.wait_verdict("a", "idle")  # it answered the probe
    assert s.stats()["restarts"] == 1 and s.stats()["probes_while_busy"] == 0


# ------------------------------------------------------------------------------------ no metrics, proxies


def test_no_metrics_is_judged_by_cheap_endpoints_only(sim, exporter) -> None:
    s = sim("--no-metrics")
    e = exporter({"a": s.url})
    b = e.wait_verdict("a", "no_metrics")
    assert "not found" in b["reason"]
    e.wait_cycles(5)
    assert e.verdict("a") == "no_metrics"
    stats = s.stats()
    assert stats["probes"] == 0 and stats["by_kind"]["generation"] == 0
    assert stats["by_kind"]["health"] + stats["by_kind"]["models"] >= 1


class RoundRobinProxy:
    """A tiny GET-only round-robin proxy: enough for the exporter's proxy check."""

    def __init__(self, upstreams: list[str]) -> None:
        state = {"i": 0}
        self.paths: list[str] = []
        paths = self.paths

        class Handler(QuietHandler):

            def do_GET(self) -> None:  # noqa: N802
                paths.append(self.path)
                upstream = upstreams[state["i"] % len(upstreams)]
                state["i"] += 1
                try:
                    r = requests.get(upstream + self.path, timeout=2)
                    status, body = r.status_code, r.content
                except requests.RequestException:
                    status, body = 503, b"no upstream\n"
                self.reply(status, body)

        self.loop = Loopback(Handler)
        self.url = self.loop.url

    def stop(self) -> None:
        self.loop.stop()


def test_proxies_are_checked_through_v1_models(sim, exporter) -> None:
    a, b = sim(), sim()
    proxy = RoundRobinProxy([a.url, b.url])
    try:
        e = exporter({"a": a.url, "b": b.url}, {"lb": proxy.url, "gone": f"http://127.0.0.1:{free_port()}"})
        wait_until(lambda: e.proxy("lb")["up"] is True and e.proxy("gone")["up"] is False, timeout=10,
                   what="proxy states")
        text = e.metrics()
        assert 'llm_health_proxy_up{proxy="lb"} 1.0' in text
        assert 'llm_health_proxy_up{proxy="gone"} 0.0' in text
        # each backend on its own schedule: wait until both were asked /v1/models and read directly
        wait_until(lambda: all(s.stats()["by_kind"]["models"] >= 1 and s.stats()["by_kind"]["metrics"] >= 1
                               for s in (a, b)), timeout=10, what="both backends read and asked /v1/models")
        # backends are read directly, never through the proxy: the proxy only ever saw /v1/models
        assert proxy.paths and set(proxy.paths) == {"/v1/models"}, proxy.paths
    finally:
        proxy.stop()
    wait_until(lambda: e.proxy("lb")["up"] is False, timeout=10, what="proxy down")


# ------------------------------------------------------------------------------------ dead, hung, slow


def test_dead_backend_is_down_after_two_readings_others_unaffected(sim, exporter) -> None:
    s = sim()
    dead_url = f"http://127.0.0.1:{free_port()}"
    e = exporter({"ok": s.url, "dead": dead_url})
    b = e.wait_verdict("dead", "down")
    assert "connection refused" in b["reason"]
    assert e.verdict("ok") == "idle"
    s.fault("crash")
    e.wait_verdict("ok", "down")
    assert 'llm_health_readings_total{backend="dead",result="refused"}' in e.metrics()
    # every verdict change but idle <-> busy is a line in the exporter's log, with its reason
    wait_until(lambda: "backend ok: idle -> unknown: connection refused" in e.proc.log(), timeout=5,
               what="the change logged")
    assert "backend dead: unknown -> down: connection refused (2 in a row)" in e.proc.log()


def test_series_for_in_flight_tokens_and_last_progress(sim, exporter) -> None:
    busy = sim()
    dead_url = f"http://127.0.0.1:{free_port()}"
    Load(busy.url, 3)
    wait_until(lambda: busy.stats()["running"] == 3, timeout=10, what="load")
    e = exporter({"busy": busy.url, "dead": dead_url})
    e.wait_verdict("busy", "busy")
    e.wait_verdict("dead", "down")
    text = e.metrics()
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(family: str, backend: str) -> float | None:
        for sample in families[family].samples:
            if sample.labels.get("backend") == backend:
                return sample.value
        return None

    assert value("llm_health_in_flight_requests", "busy") == 3
    assert (value("llm_health_generation_tokens_per_second", "busy") or 0) > 0
    progress = value("llm_health_last_progress_timestamp_seconds", "busy")
    assert progress is not None and abs(progress - time.time()) < 30
    # never seen progress is missing data: no sample, not a timestamp of 1970
    assert value("llm_health_last_progress_timestamp_seconds", "dead") is None


def test_hung_backend_delays_no_one(sim, exporter) -> None:
    good, hung = sim(), sim()
    Load(good.url, 2)
    e = exporter({"good": good.url, "hung": hung.url})
    e.wait_verdict("good", "busy")
    e.wait_verdict("hung", "idle")
    hung.fault("hang")
    e.wait_verdict("hung", "down")
    before = e.backend("good")
    e.wait_cycles(8)
    seen = watch(e, "good", lambda: True, timeout=1)
    assert seen == ["busy"]
    after_text = e.metrics()
    assert 'llm_health_readings_total{backend="good",result="timeout"} 0.0' in after_text
    assert 'llm_health_readings_total{backend="hung",result="timeout"} 0.0' not in after_text
    assert e.backend("good")["since"] == before["since"]  # busy the whole time
    assert good.stats()["probes"] == 0


def test_slow_metrics_under_load_is_neither_down_nor_stalled(sim, exporter) -> None:
    """Principle 3: vLLM's /metrics comes from its API server's event loop, slow under load; while
    /health answers a slow page is no evidence, however long it lasts (here 3x stall_after)."""
    s = sim()
    Load(s.url, 4)
    e = exporter({"a": s.url}, None, "--stall-after", 1)
    e.wait_verdict("a", "busy")
    # slower than the read timeout (0.5 s), /health fine
    s.fault("slow_metrics", 0.8)
    t0 = time.monotonic()
    seen = watch(e, "a", lambda: e.verdict("a") == "unknown", timeout=5)
    assert "down" not in seen and "stalled" not in seen
    assert "timed out" in e.backend("a")["reason"] and "/health fine" in e.backend("a")["reason"]
    seen = watch(e, "a", lambda: time.monotonic() - t0 > 3.0, timeout=10)
    assert set(seen) == {"unknown"}, seen
    s.fault("none")
    seen = watch(e, "a", lambda: e.verdict("a") == "busy", timeout=5)
    assert "down" not in seen and "stalled" not in seen
    # slow but within the timeout: busy all along
    s.fault("slow_metrics", 0.2)
    e.wait_cycles(4)
    assert e.verdict("a") == "busy"
    assert s.stats()["probes"] == 0


# ------------------------------------------------------------------------------------ engine quirks


def test_long_single_prefill_on_v1_is_never_stalled(sim, exporter) -> None:
    # 100000 prompt tokens in 256-token chunks of 0.02 s: a prefill of ~8 s, far longer than the two
    # readings below take, so both are taken inside the prefill (each waits for running == 1 explicitly)
    s = sim("--kv-blocks", 8192, "--chunk-tokens", 256, "--step-seconds", 0.02, "--prompt-tokens", 100000)
    e = exporter({"a": s.url})
    e.wait_verdict("a", "idle")
    probes_before = s.stats()["probes"]
    # the load begins right after a probe arrived: the next probe follows the next reading, which shows the
    # request (a request that arrives between an idle reading and its probe is a race no exporter can see,
    # and it failed this test on a loaded machine: probes_while_busy 1)
    wait_until(lambda: s.stats()["probes"] > probes_before, timeout=10, interval=0.01, what="a probe of the idle server")
    probes_before = s.stats()["probes"]
    Load(s.url, 1, max_tokens=1)

    def in_prefill(moved_from: float | None = None):  # noqa: ANN202
        eng = s.reading().engines["0"]
        if eng.running != 1 or eng.kv_usage is None or eng.kv_usage <= 0:
            return None
        return eng if moved_from is None or eng.kv_usage != moved_from else None

    first = wait_until(in_prefill, timeout=5, what="prefill started")
    second = wait_until(lambda: in_prefill(first.kv_usage), timeout=5, what="kv moves during the prefill")
    # only the KV gauge moves during the prefill: every counter is frozen
    assert second.running == 1 and second.kv_usage != first.kv_usage
    assert second.counters["generation_tokens"] == first.counters["generation_tokens"]
    assert second.counters["iteration_count"] == first.counters["iteration_count"]
    seen = watch(e, "a", lambda: s.stats()["running"] == 0, timeout=30)
    assert "stalled" not in seen and "down" not in seen
    assert seen.count("busy") >= len(seen) // 2, seen
    assert s.stats()["probes_while_busy"] == 0
    assert s.stats()["probes"] >= probes_before


def test_v0_idle_page_is_idle_not_busy(sim, exporter) -> None:
    s = sim("--engine", "v0", "--idle-log-seconds", 0.1)
    requests.post(s.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 3}, timeout=10)
    e = exporter({"a": s.url})
    e.wait_verdict("a", "idle")
    page1 = requests.get(s.url + "/metrics", timeout=5).text
    seen = watch(e, "a", lambda: e.verdicts()["cycles"] > 12, timeout=15)
    page2 = requests.get(s.url + "/metrics", timeout=5).text

    def count_of(page: str) -> float:
        line = next(x for x in page.splitlines() if x.startswith("vllm:iteration_tokens_total_count"))
        return float(line.split()[-1])

    assert count_of(page2) > count_of(page1)  # V0's idle observations did happen
    assert set(seen) == {"idle"}, seen


# ------------------------------------------------------------------------------------ check and verify


def _check(url: str, *extra: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(llm_health("check", url, "--interval", 0.3, "--timeout", 0.5, *extra),
                          capture_output=True, text=True, timeout=60)


def test_check_exit_codes(sim) -> None:
    idle = sim()
    r = _check(idle.url)
    assert r.returncode == 0 and r.stdout.startswith("OK: idle"), r.stdout + r.stderr
    assert idle.stats()["probes"] == 1

    busy = sim()
    Load(busy.url, 3)
    wait_until(lambda: busy.stats()["running"] == 3, timeout=5, what="load")
    r = _check(busy.url)
    assert r.returncode == 0 and "busy" in r.stdout, r.stdout + r.stderr
    busy.fault("stall")
    # frozen counters over less than --stall-after prove nothing: unknown, not a hair-trigger stalled
    r = _check(busy.url)
    assert r.returncode == 1 and "UNKNOWN" in r.stdout and "--stall-after" in r.stdout, r.stdout + r.stderr
    r = _check(busy.url, "--readings", 4, "--stall-after", 0.8)
    assert r.returncode == 2 and "stalled" in r.stdout, r.stdout + r.stderr
    assert busy.stats()["probes"] == 0

    nometrics = sim("--no-metrics")
    r = _check(nometrics.url)
    assert r.returncode == 1 and "no_metrics" in r.stdout, r.stdout + r.stderr

    r = _check(f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 2 and "down" in r.stdout, r.stdout + r.stderr

    r = subprocess.run(llm_health("check", "not-a-url"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "url" in r.stderr


def test_verify_outcomes(sim) -> None:
    kw = {"readings": 2, "interval": 0.3, "read_timeout": 0.5, "probe_timeout": 2.0}
    idle = sim()
    v = verify(idle.url, **kw)
    assert (v.outcome, v.in_flight) == ("idle_ok", 0)

    busy = sim()
    Load(busy.url, 2)
    wait_until(lambda: busy.stats()["running"] == 2, timeout=5, what="load")
    v = verify(busy.url, **kw)
    assert v.outcome == "progress" and v.in_flight == 2
    busy.fault("slow_metrics", 1.0)
    assert verify(busy.url, **kw).outcome == "unknown"
    busy.fault("stall")
    v = verify(busy.url, **kw)
    assert v.outcome == "no_progress" and "no engine progress" in v.reason
    assert busy.stats()["probes"] == 0

    assert verify(f"http://127.0.0.1:{free_port()}", **kw).outcome == "down"
    assert verify(sim("--no-metrics").url, **kw).outcome == "unknown"

    # restarted between the two readings (the sleep between them is injected)
    restarting = sim("--restart-seconds", 0.0)
    v = verify(restarting.url, **{**kw, "sleep": lambda _s: (restarting.fault("restart", 0.0),
                                                             wait_until(lambda: _open(restarting), timeout=5))})
    assert v.outcome == "restarted", v


def _open(s: Sim) -> bool:
    try:
        return requests.get(s.url + "/v1/models", timeout=1).status_code == 200 and s.stats()["restarts"] >= 1
    except requests.RequestException:
        return False


def test_exporter_refuses_bad_input() -> None:
    r = subprocess.run(llm_health("exporter", "--backend", "no-equals-sign"), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "NAME=URL" in r.stderr
    r = subprocess.run(llm_health("exporter"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "nothing to watch" in r.stderr


def test_exporter_reads_the_shared_config_file(sim, exporter, tmp_path: Path) -> None:
    s = sim()
    cfg = tmp_path / "llm-health.yml"
    cfg.write_text(f"backends:\n  - name: gpu-a\n    url: {s.url}\n    model: sim-model\n"
                   "exporter:\n  interval: 0.3\n  stall_after: 2\n  probe_every: 0.6\n")
    e = exporter({}, None, "--config", cfg)
    e.wait_verdict("gpu-a", "idle")
    bad = tmp_path / "bad.yml"
    bad.write_text("exporter:\n  interval: fast\n")
    r = subprocess.run(llm_health("exporter", "--config", bad), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "exporter.interval" in r.stderr


def test_probes_are_spaced_by_probe_every_and_one_at_a_time(sim) -> None:
    from llm_health.config import Backend, ExporterSettings
    from llm_health.exporter.scheduler import ReadScheduler

    s = sim()
    fleet = ReadScheduler([Backend(name="a", url=s.url)], [],
                  ExporterSettings(interval=0.3, probe_every=0.6, read_timeout=1.0, probe_timeout=2.0))
    try:
        slot = fleet.backends[0]
        for k in range(8):
            fleet.read_all(due=k * 0.3)  # the read's schedule, as the scheduler passes it
            if slot.probe is not None:
                wait_until(slot.probe.done, timeout=5, what="probe answered")
        assert slot.probes_sent == 4  # cycles 0, 2, 4, 6
        assert s.stats()["probes"] == 4
        # a probe still in flight blocks the next one, whatever the schedule says
        from concurrent.futures import Future

        slot.probe = Future()
        fleet.read_all(due=100.0)
        assert slot.probes_sent == 4 and s.stats()["probes"] == 4
        slot.probe.set_result(None)
        slot.probe = None
        fleet.read_all(due=101.0)
        wait_until(lambda: slot.probes_sent == 5, timeout=5, what="the fifth probe sent (counted by its worker)")
    finally:
        fleet.close()


def test_verdict_changes_are_logged_idle_busy_only_at_debug(sim, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from llm_health.config import Backend, ExporterSettings
    from llm_health.exporter.scheduler import ReadScheduler

    s = sim()
    fleet = ReadScheduler([Backend(name="a", url=s.url)], [], ExporterSettings(interval=0.3, read_timeout=1.0))
    caplog.set_level(logging.DEBUG, logger="llm_health.exporter")
    try:
        fleet.read_all(due=0.0)
        assert fleet.backends[0].state.verdict == "idle"
        Load(s.url, 2)
        wait_until(lambda: s.stats()["running"] == 2, timeout=10, what="2 running")
        due = iter(k * 0.3 for k in range(1, 1000))

        def busy() -> bool:   # a reading each poll: busy once the engine moved between two of them
            fleet.read_all(due=next(due))
            return fleet.backends[0].state.verdict == "busy"

        wait_until(busy, timeout=10, what="judged busy")
    finally:
        fleet.close()
    changes = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llm_health.exporter"]
    assert changes[0] == (logging.INFO, "backend a: unknown -> idle: 0 running, 0 waiting"), changes
    assert [level for level, text in changes if "idle -> busy" in text] == [logging.DEBUG], changes
