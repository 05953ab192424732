"""stop -> headroom -> start (remediator/sequence.py): the start waits for headroom, and never comes
without it; and what the authority does with a restart whose headroom never passed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llm_health.config import ConfigError, parse_config
from llm_health.remediator import action
from llm_health.remediator.sequence import HEADROOM_EXIT, main, restart_argv
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

PY = sys.executable


def step(path: Path, text: str) -> list[str]:
    return [PY, "-c", f"open({str(path)!r}, 'a').write({text!r} + '\\n')"]


def steps(tmp_path: Path, headroom: list[str]) -> str:
    return json.dumps({"stop": step(tmp_path / "log", "stop"), "headroom": headroom,
                       "start": step(tmp_path / "log", "start")})


def test_the_start_waits_until_headroom_passes(tmp_path: Path) -> None:
    # the memory comes free at the third check
    check = [PY, "-c", f"import os, sys; p = {str(tmp_path / 'n')!r}; n = int(open(p).read()) + 1 if os.path.exists(p) "
             "else 1; open(p, 'w').write(str(n)); sys.exit(0 if n >= 3 else 1)"]
    assert main(["--wait", "30", "--poll", "0.05", "--check-timeout", "5", steps(tmp_path, check)]) == 0
    assert (tmp_path / "log").read_text().split() == ["stop", "start"]
    assert (tmp_path / "n").read_text() == "3"


def test_without_headroom_nothing_starts(tmp_path: Path) -> None:
    assert main(["--wait", "0.3", "--poll", "0.05", "--check-timeout", "5",
                 steps(tmp_path, [PY, "-c", "import sys; sys.exit(1)"])]) == HEADROOM_EXIT
    assert (tmp_path / "log").read_text().split() == ["stop"]


def test_a_hung_check_is_killed_and_counts_as_no_headroom(tmp_path: Path) -> None:
    hung = [PY, "-c", "import time; time.sleep(60)"]
    assert main(["--wait", "0.5", "--poll", "0.05", "--check-timeout", "0.3", steps(tmp_path, hung)]) == HEADROOM_EXIT


def test_a_failed_stop_starts_nothing(tmp_path: Path) -> None:
    doc = json.dumps({"stop": [PY, "-c", "import sys; sys.exit(4)"], "headroom": [], "start": step(tmp_path / "log", "start")})
    assert main(["--wait", "1", "--poll", "0.1", "--check-timeout", "1", doc]) == 4
    assert not (tmp_path / "log").exists()


def test_the_config_says_what_a_headroom_needs() -> None:
    base = {"name": "gpu-a", "url": "http://127.0.0.1:1"}
    with pytest.raises(ConfigError, match="headroom: needs stop and start"):
        parse_config({"backends": [{**base, "restart": ["r"], "headroom": ["h"]}]})
    with pytest.raises(ConfigError, match="not both"):
        parse_config({"backends": [{**base, "restart": ["r"], "stop": ["s"], "start": ["s"]}]})
    with pytest.raises(ConfigError, match="stop: needs start"):
        parse_config({"backends": [{**base, "stop": ["s"]}]})
    config = parse_config({"backends": [{**base, "stop": ["s"], "headroom": ["h"], "start": ["go"]}]})
    argv = restart_argv(config.backends[0], config.remediator)
    assert argv[1:3] == ("-m", "llm_health.remediator.sequence") and json.loads(argv[-1])["start"] == ["go"]



def test_a_stored_command_takes_the_place_of_start_or_restart() -> None:
    """A rollout's command (remediator/rollout/): for a three-step backend it is the new `start` (the stop and
    the headroom check still come first); for a one-argv backend it is the new `restart`."""
    base = {"name": "gpu-a", "url": "http://127.0.0.1:1"}
    three = parse_config({"backends": [{**base, "stop": ["s"], "headroom": ["h"], "start": ["go"]}]})
    steps = json.loads(restart_argv(three.backends[0], three.remediator, ("go", "--v2"))[-1])
    assert steps == {"stop": ["s"], "headroom": ["h"], "start": ["go", "--v2"]}
    one = parse_config({"backends": [{**base, "restart": ["r"]}]})
    assert restart_argv(one.backends[0], one.remediator, ("r", "--v2")) == ("r", "--v2")
    assert restart_argv(one.backends[0], one.remediator, None) == ("r",)


def test_a_restart_whose_headroom_never_passed_waits_for_a_person(tmp_path: Path) -> None:
    w = fleet(tmp_path, ("gpu-a", "gpu-b", "gpu-c"), min_ready=1)
    import dataclasses
    w.config = dataclasses.replace(w.config, backends=tuple(
        dataclasses.replace(b, restart=(), stop=("stop-a",), start=("start-a",), headroom=("room-a",))
        if b.name == "gpu-a" else b for b in w.config.backends))
    w.authority.ctx.config = w.config
    w.work["gpu-a"] = 0
    w.result = action.ActionResult(action.FAILED, HEADROOM_EXIT, "HEADROOM NEVER PASSED")
    w.ready["gpu-a"] = False                           # nothing was started: it does not answer
    w.deliver(payload(alert("gpu-a")))
    w.run_until(lambda: w.restarted == ["gpu-a"], "the restart ran")
    w.run()
    assert w.calls[0][1:3] == ("-m", "llm_health.remediator.sequence")
    assert w.state("gpu-a") == "error" and w.last_incident("gpu-a")["state"] == "needs_ack"
    assert "host needs attention" in w.events("gpu-a", "escalated")[0].reason
    assert w.events("gpu-a", "no_headroom")
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert 'llm_health_remediator_host_needs_attention{backend="gpu-a"} 1.0' in metrics
    assert 'llm_health_remediator_host_needs_attention{backend="gpu-b"} 0.0' in metrics
    for _ in range(3):
        w.clock.advance(1000)
        w.run()
    assert w.restarted == ["gpu-a"]                     # never a restart loop
    assert w.client.post("/api/backends/gpu-a/ack", headers=AUTH).status_code == 200
