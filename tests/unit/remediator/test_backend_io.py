"""The remediator counts its probes through exporter.check.verify's `on_probe`, not by patching the exporter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llm_health.exporter import check, probe
from llm_health.exporter.observation import Observation, ProbeOutcome, ProbeResult, ReadResult
from llm_health.exporter.reading import EngineReading, Reading
from llm_health.remediator import backend_io
from llm_health.remediator.authority import Authority
from llm_health.remediator.store import SqliteStore

from llm_health.config import parse_config


def idle() -> Observation:
    return Observation(ReadResult.OK, Reading("v1", {"0": EngineReading(counters={"generation_tokens": 5.0})},
                                              process_start=1.0))


def test_on_probe_is_called_before_every_probe_also_one_that_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []

    class FailingProber:
        def __init__(self, *args: Any) -> None:
            pass

        def probe(self) -> ProbeResult:
            log.append("probe")
            return ProbeResult(ProbeOutcome.TIMEOUT, "no answer")

        def close(self) -> None:
            pass

    monkeypatch.setattr(check, "Prober", FailingProber)
    monkeypatch.setattr(check, "observe", lambda target: idle())
    v = check.verify("http://127.0.0.1:9", readings=2, interval=0, sleep=lambda s: None,
                     on_probe=lambda: log.append("counted"))
    assert v.outcome == "down"
    assert log == ["counted", "probe", "counted", "probe"]


def test_the_authority_leaves_the_exporter_as_it_is(tmp_path: Path) -> None:
    config = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                           "remediator": {"state": "state.db"}}, source=str(tmp_path / "c.yml"))
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    Authority(store, config, holder="t")
    assert check.Prober is probe.Prober                       # no subclass swapped in at run time
    store.close()


def test_each_purpose_counts_its_own_probes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    config = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    counter = backend_io.ProbeCounter(store)
    backend = config.backends[0]
    counter.counting(backend_io.VERIFY)(backend)
    counter.counting(backend_io.WARMUP)(backend)
    counter.counting(backend_io.WARMUP)(backend)
    assert store.counters("probes") == {"a\tverify": 1, "a\twarmup": 2}
    store.close()
