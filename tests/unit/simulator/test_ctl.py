"""`python -m llm_health.simulator.ctl` in-process against an in-process simulator: the body it sends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from llm_health.drill.procs import free_port, wait_until
from llm_health.simulator import ctl
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.simserver import stats


@pytest.fixture
def sim() -> Iterator[Simulator]:
    s = Simulator(SimConfig(port=free_port(), control_port=free_port(), time_scale=10, restart_seconds=0)).start()
    wait_until(lambda: requests.get(s.url + "/health", timeout=1).ok, what="simulator up")
    yield s
    s.stop()


def test_restart_with_step_seconds_and_version(sim: Simulator, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["restart", sim.control_url, "--seconds", "0", "--step-seconds", "0.2",
                     "--version", "0.8.5-canary"]) == 0
    assert '"fault": "restart"' in capsys.readouterr().out
    wait_until(lambda: stats(sim)["restarts"] == 1 and stats(sim)["port_open"], what="restarted")
    st = stats(sim)
    assert st["step_seconds"] == 0.2 and st["version"] == "0.8.5-canary"
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.8.5-canary"}
    # a plain restart sends neither: the deployed command stays
    assert ctl.main(["restart", sim.control_url]) == 0
    wait_until(lambda: stats(sim)["restarts"] == 2 and stats(sim)["port_open"], what="restarted again")
    st = stats(sim)
    assert st["step_seconds"] == 0.2 and st["version"] == "0.8.5-canary"


@pytest.mark.parametrize("flags", [["--step-seconds", "0"], ["--step-seconds", "nan"], ["--step-seconds", "fast"],
                                   ["--version", ""], ["--version", "x" * 65]])
def test_bad_restart_flags_exit_2_and_send_nothing(sim: Simulator, flags: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ctl.main(["restart", sim.control_url, *flags])
    assert exc.value.code == 2 and "--" in capsys.readouterr().err
    st = stats(sim)
    assert st["restarts"] == 0 and st["fault"] == "none" and st["step_seconds"] == 0.05 and st["version"] == "0.11.2"


def test_fault_has_no_restart_flags(sim: Simulator) -> None:
    with pytest.raises(SystemExit):
        ctl.main(["fault", "stall", sim.control_url, "--step-seconds", "0.2"])
    assert stats(sim)["fault"] == "none"
