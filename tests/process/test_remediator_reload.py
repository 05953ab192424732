"""SIGHUP to a real remediator (gunicorn master, 2 workers) reads its config file again: a backend added
and one removed, the state (a busy marker) kept; a bad file, a moved state file or an unreadable token
keep the running config, the log says why, and llm_health_remediator_config_last_reload_successful says 0
until a reload works. The master survives every one of them."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import free_port, wait_until
from tests.support.remediator_process import Remediator

SUCCESSFUL = "llm_health_remediator_config_last_reload_successful"
SUCCESS_AT = "llm_health_remediator_config_last_reload_success_timestamp_seconds"


URLS: dict[str, str] = {}


def config(*names: str, **remediator: Any) -> dict[str, Any]:
    urls = [URLS.setdefault(n, f"http://127.0.0.1:{free_port()}") for n in names]   # a backend keeps its URL
    return {"backends": [{"name": n, "url": u, "restart": ["true"]} for n, u in zip(names, urls, strict=True)],
            "remediator": remediator}


def gauges(r: Remediator) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(r.get("/metrics").text) for s in f.samples
            if s.name in (SUCCESSFUL, SUCCESS_AT)}


def backends(r: Remediator) -> dict[str, dict[str, Any]]:
    return {b["backend"]: b for b in r.get("/api/backends").json()["backends"]}


def hang_up(r: Remediator, what: str, until: Any) -> Any:
    r.proc.proc.send_signal(signal.SIGHUP)
    try:
        return wait_until(until, timeout=30, interval=0.1, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{r.proc.log()[-3000:]}") from None


def test_sighup_rereads_the_config_and_refuses_a_bad_one(tmp_path: Path) -> None:
    r = Remediator(tmp_path, config("a", "c"), workers=2)
    try:
        r.wait_ready()
        started = gauges(r)
        assert started[SUCCESSFUL] == 1 and set(backends(r)) == {"a", "c"}
        marker = r.post("/api/busy", {"backend": "a", "owner": "batch-1", "ttl_seconds": 3600})
        assert marker.status_code == 201, marker.text

        # a good file: b added, c removed; a keeps its marker (the state file goes on)
        r.write_config(config("a", "b"))
        hang_up(r, "b and no c on every answer, a with its marker",
                lambda: all(set(b := backends(r)) == {"a", "b"} and [m["id"] for m in b["a"]["markers"]]
                            == [marker.json()["id"]] for _ in range(2)))
        good = wait_until(lambda: (g := gauges(r))[SUCCESS_AT] > started[SUCCESS_AT] and g, timeout=10,
                          what="the reload's time")
        assert good[SUCCESSFUL] == 1
        assert "config reloaded: 2 backend(s) (+b -c)" in r.proc.log()

        # refused: a file that does not load, a moved state file, a token file that cannot be read
        refusals = [
            ("backends: [\n", "not valid YAML"),
            (config("a", "b", "d", state="elsewhere.db"), "remediator.state changed"),
            (config("a", "b", "d", token_file="missing-token"), "cannot read"),
        ]
        for data, why in refusals:
            if isinstance(data, str):
                r.config_path.write_text(data)
            else:
                r.write_config(data)
            log_before = len(r.proc.log())
            hang_up(r, f"the refusal ({why}) logged",
                    lambda why=why, n=log_before: why in r.proc.log()[n:] and "config reload failed" in r.proc.log()[n:])
            wait_until(lambda: all(gauges(r) == {SUCCESSFUL: 0, SUCCESS_AT: good[SUCCESS_AT]}
                                   and set(backends(r)) == {"a", "b"} for _ in range(2)), timeout=30,
                       what="every worker says the reload failed and serves the running config")
            assert r.proc.alive()
        wait_until(lambda: r.get("/healthz").ok, timeout=30, what="/healthz")

        # fixed: 1 again, d added, a still with its marker
        r.write_config(config("a", "b", "d"))
        hang_up(r, "a good reload on every worker",
                lambda: all(gauges(r)[SUCCESSFUL] == 1 and "d" in (b := backends(r)) and
                            [m["id"] for m in b["a"]["markers"]] == [marker.json()["id"]] for _ in range(2)))
    finally:
        r.stop()
