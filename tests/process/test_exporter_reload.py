"""SIGHUP reloads a real exporter's config file: backends added and removed while the others keep their
state (verdict `since`, reading counters), a bad file or a restart-only change keeps the running config and
says why, and llm_health_exporter_config_last_reload_successful says what the last reload did."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from tests.support.simrig import Exporter, Sim

SUCCESSFUL = "llm_health_exporter_config_last_reload_successful"
SUCCESS_AT = "llm_health_exporter_config_last_reload_success_timestamp_seconds"


def write(path: Path, port: int, backends: dict[str, str], **exporter: Any) -> None:
    settings = {"listen": f"127.0.0.1:{port}", "interval": 0.3, "stall_after": 2, "read_timeout": 0.5,
                "probe_timeout": 2, **exporter}
    path.write_text(yaml.safe_dump({"backends": [{"name": n, "url": u} for n, u in backends.items()],
                                    "exporter": settings}))


def gauges(e: Exporter) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(e.metrics()) for s in f.samples
            if s.name in (SUCCESSFUL, SUCCESS_AT)}


def names(e: Exporter) -> set[str]:
    return {b["backend"] for b in e.verdicts()["backends"]}


def hang_up_and_wait(e: Exporter, what: str, until: Callable[[], Any]) -> Any:
    e.proc.proc.send_signal(signal.SIGHUP)
    try:
        return wait_until(until, timeout=15, interval=0.05, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{e.proc.log()[-3000:]}") from None


def test_sighup_adds_and_removes_backends_and_keeps_the_others_state(
        sim: Callable[..., Sim], launch: Callable[..., ManagedProcess], tmp_path: Path) -> None:
    a, b = sim(), sim()
    port = free_port()
    config = tmp_path / "llm-health.yml"
    write(config, port, {"a": a.url})
    e = Exporter(launch(llm_health("exporter", "--config", config), "exporter"), port)
    e.proc.wait_http(e.url + "/health")
    e.wait_verdict("a", "idle")
    wait_until(lambda: e.backend("a")["readings"]["ok"] >= 5, timeout=10, what="a few readings of a")
    started = gauges(e)
    assert started[SUCCESSFUL] == 1 and started[SUCCESS_AT] > 0
    before = e.backend("a")

    # a good file adds b: a keeps its verdict's start, its counters go on
    write(config, port, {"a": a.url, "b": b.url})
    hang_up_and_wait(e, "b watched", lambda: "b" in names(e))
    e.wait_verdict("b", "idle")
    after = wait_until(lambda: (x := e.backend("a"))["readings"]["ok"] > before["readings"]["ok"] + 2 and x,
                       timeout=10, what="a read on")
    assert after["since"] == before["since"] and after["verdict"] == "idle"
    assert after["probes_sent"] >= before["probes_sent"]
    reloaded = gauges(e)
    assert reloaded[SUCCESSFUL] == 1 and reloaded[SUCCESS_AT] > started[SUCCESS_AT]
    assert "config reloaded: 2 backend(s), 0 proxy(ies) (+b)" in e.proc.log()

    # removing a: a is forgotten, b keeps its state
    b_before = e.backend("b")
    write(config, port, {"b": b.url})
    hang_up_and_wait(e, "a forgotten", lambda: names(e) == {"b"})
    assert e.backend("b")["since"] == b_before["since"]
    last_good = wait_until(lambda: (g := gauges(e))[SUCCESS_AT] > reloaded[SUCCESS_AT] and g[SUCCESS_AT],
                           timeout=5, what="the second reload's time")

    # a bad file: the running config stays, the metric says 0, the log says why
    b_before = e.backend("b")
    config.write_text("backends: [\n")
    hang_up_and_wait(e, "the failed reload in the metric", lambda: gauges(e)[SUCCESSFUL] == 0)
    assert "config reload failed, the running configuration stays" in e.proc.log()
    assert "not valid YAML" in e.proc.log()
    assert names(e) == {"b"} and gauges(e)[SUCCESS_AT] == last_good      # the last reload that worked
    wait_until(lambda: e.backend("b")["readings"]["ok"] > b_before["readings"]["ok"], timeout=10,
               what="b still read")

    # a setting only a restart applies: refused as a whole (a is not added either)
    write(config, port, {"a": a.url, "b": b.url}, interval=1.0)
    hang_up_and_wait(e, "the refusal in the log", lambda: "exporter.interval changed" in e.proc.log())
    assert gauges(e)[SUCCESSFUL] == 0 and names(e) == {"b"}

    # fixed: back to 1, a is back (a new start: unknown until read)
    write(config, port, {"a": a.url, "b": b.url})
    hang_up_and_wait(e, "a good reload", lambda: gauges(e)[SUCCESSFUL] == 1)
    assert names(e) == {"a", "b"} and e.backend("b")["since"] == b_before["since"]
    assert e.proc.alive()
