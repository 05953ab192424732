"""The authority's default backend I/O (remediator/backend_io.py): probes counted through exporter.check.verify's
`on_probe`, not by patching the exporter, in SQLite and /metrics, per purpose; the exporter's API key file
read once and passed to verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from llm_health.config import Backend, ConfigError, parse_config
from llm_health.drill.procs import free_port, wait_until
from llm_health.exporter import check, probe
from llm_health.exporter.observation import Observation, ProbeOutcome, ProbeResult, ReadResult, Verification
from llm_health.exporter.reading import EngineReading, Reading
from llm_health.remediator import backend_io
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.store import SqliteStore
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.fakes import has_sample


def idle() -> Observation:
    return Observation(ReadResult.OK, Reading("v1", {"0": EngineReading(counters={"generation_tokens": 5.0})},
                                              process_start=1.0))


def test_on_probe_is_called_before_every_probe_also_one_that_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []

    class FailingProber:
        def __init__(self, *args: Any) -> None:
            pass

        def probe(self) -> ProbeResult:
            log.append("probe")   # an error (not a timeout: that one is not followed by a second probe)
            return ProbeResult(ProbeOutcome.ERROR, "connection reset")

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


@pytest.fixture
def sim() -> Any:
    """An in-process simulator (here in place of the conftest's `sim`, which starts processes)."""
    s = Simulator(SimConfig(port=free_port(), model="sim-model")).start()
    try:
        wait_until(lambda: requests.get(s.url + "/health", timeout=1).ok, what="simulator")
        yield s
    finally:
        s.stop()


def test_every_probe_is_counted_in_sqlite_and_metrics(tmp_path: Path, sim: Simulator) -> None:
    (tmp_path / "key").write_text("secret-key\n")
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": sim.url, "model": "sim-model", "restart": ["true"]}],
        "exporter": {"read_timeout": 2.0, "probe_timeout": 5.0, "api_key_file": "key"},
        "remediator": {"state": "state.db", "verify_readings": 2, "verify_interval": 0.1, "insecure_no_auth": True},
    }, source=str(tmp_path / "llm-health.yml"))
    app = create_app(config, with_authority=False)
    store = app.extensions["remediator"].store
    auth = Authority(store, config, holder="probe-test")
    backend = config.backend("gpu-a")
    assert backend is not None
    v = auth.io.verifier(backend)
    assert v.outcome == "idle_ok"
    ready, why = auth.io.warmup_check(backend)
    assert ready, why
    assert store.counters("probes") == {"gpu-a\tverify": 1, "gpu-a\twarmup": 1}
    text = app.test_client().get("/metrics").get_data(as_text=True)
    assert has_sample(text, 'llm_health_remediator_probes_total{backend="gpu-a",purpose="verify"} 1')
    assert has_sample(text, 'llm_health_remediator_probes_total{backend="gpu-a",purpose="warmup"} 1')
    from llm_health.exporter import check
    assert check.verify(sim.url, readings=2, interval=0.1).outcome == "idle_ok"   # outside: not counted
    assert store.counters("probes") == {"gpu-a\tverify": 1, "gpu-a\twarmup": 1}
    store.close()


def test_api_key_file_is_read_once_and_passed_to_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_health.exporter import check
    seen: list[dict[str, Any]] = []

    def fake_verify(url: str, *, api_key: str = "", **kw: Any) -> Verification:
        seen.append({**kw, **({"api_key": api_key} if api_key else {})})
        return Verification("idle_ok", "fake")
    monkeypatch.setattr(check, "verify", fake_verify)
    (tmp_path / "key").write_text("  s3cret \n")
    config = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                           "exporter": {"api_key_file": "key"}}, source=str(tmp_path / "x.yml"))
    verify = backend_io.default_verifier(config)
    (tmp_path / "key").write_text("changed")
    verify(config.backends[0])
    verify(config.backends[0])
    assert [kw["api_key"] for kw in seen] == ["s3cret", "s3cret"]
    assert seen[0]["readings"] == 2 and seen[0]["interval"] == 5.0
    missing = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                            "exporter": {"api_key_file": "nope"}}, source=str(tmp_path / "x.yml"))
    v = backend_io.default_verifier(missing)(missing.backends[0])
    assert v.outcome == "unknown" and "unreadable" in v.reason
    plain = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    backend_io.default_verifier(plain)(plain.backends[0])
    assert "api_key" not in seen[-1]


def test_a_backend_seen_for_the_first_time_passes_the_whole_warm_up_gate(tmp_path: Path, sim: Simulator) -> None:
    """Not READY on /health and /v1/models alone: the engine must also verify healthy (progress, or idle
    and a one-token request that succeeds), as after a restart of ours."""
    from llm_health.exporter.observation import VerifyOutcome
    config = parse_config({"backends": [{"name": "gpu-a", "url": sim.url}], "remediator": {"state": str(tmp_path / "s.db")}})
    outcome = {"now": VerifyOutcome.NO_PROGRESS}
    io = backend_io.default_io(SqliteStore(str(tmp_path / "s.db")), config,
                               verifier=lambda b: Verification(outcome["now"], "fake"))
    assert io.first_seen_check is io.warmup_check
    ready, why = io.first_seen_check(config.backends[0])
    assert not ready and "no_progress" in why             # answers /health and /v1/models, yet not warm
    outcome["now"] = VerifyOutcome.IDLE_OK
    assert io.first_seen_check(config.backends[0])[0]


def test_the_exporter_is_this_files_own_unless_told_otherwise() -> None:
    base = {"backends": [{"name": "a", "url": "http://127.0.0.1:9"}]}
    assert backend_io.exporter_url(parse_config(base)) == "http://127.0.0.1:9410"
    assert backend_io.exporter_url(parse_config({**base, "exporter": {"listen": "0.0.0.0:9555"}})) == \
        "http://127.0.0.1:9555"
    assert backend_io.exporter_url(parse_config({**base, "remediator": {"exporter_url": "none"}})) == ""
    assert backend_io.exporter_url(parse_config(
        {**base, "remediator": {"exporter_url": "http://exporter:9410"}})) == "http://exporter:9410"
    with pytest.raises(ConfigError, match="remediator.exporter_url"):
        parse_config({**base, "remediator": {"exporter_url": "exporter:9410"}})


@pytest.mark.parametrize("row", [
    {"backend": "a", "verdict": "busy", "progress_signature": "ab" * 16, "frozen_for_seconds": 60},
    {"backend": "a", "verdict": "stalled", "progress_signature": "not hex!", "frozen_for_seconds": 60},
    {"backend": "a", "verdict": "stalled", "progress_signature": "ab" * 16, "frozen_for_seconds": -1},
    {"backend": "a", "verdict": "stalled", "progress_signature": "ab" * 16, "frozen_for_seconds": True},
    {"backend": "a", "verdict": "stalled", "progress_signature": "ab" * 16},
    {"backend": "other", "verdict": "stalled", "progress_signature": "ab" * 16, "frozen_for_seconds": 60},
], ids=["not-stalled", "bad-signature", "negative", "bool", "missing", "another-backend"])
def test_an_exporter_answer_that_is_not_clear_evidence_is_none(row: dict[str, Any]) -> None:
    import json

    from llm_health.httpserver import QuietHandler
    from tests.support.loopback import Loopback

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.reply(200, json.dumps({"backends": [row]}), "application/json")

    server = Loopback(Handler)
    try:
        url = server.url
        good = {**row, "backend": "a", "verdict": "stalled", "progress_signature": "ab" * 16,
                "frozen_for_seconds": 60}
        assert backend_io.frozen_evidence(url, Backend("a", "http://127.0.0.1:9")) is None
        row.clear()
        row.update(good)                      # the same server, a clear answer: evidence
        ev = backend_io.frozen_evidence(url, Backend("a", "http://127.0.0.1:9"), clock=lambda: 5.0)
        assert ev is not None and (ev.signature, ev.frozen_for, ev.at) == ("ab" * 16, 60.0, 5.0)
        assert ev.page_is_work_queue is False  # not said: not llama.cpp's loop
        for said, meant in ((True, True), ("true", False), (1, False)):
            row["page_is_work_queue"] = said
            ev = backend_io.frozen_evidence(url, Backend("a", "http://127.0.0.1:9"))
            assert ev is not None and ev.page_is_work_queue is meant, said
    finally:
        server.stop()


def test_the_verifier_hands_the_evidence_to_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_health.exporter import check
    from llm_health.exporter.observation import FrozenEvidence
    seen: list[Any] = []

    def fake_verify(url: str, *, evidence: FrozenEvidence | None = None, **kw: Any) -> Verification:
        seen.append(evidence)
        return Verification("idle_ok", "fake")
    monkeypatch.setattr(check, "verify", fake_verify)
    config = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    ev = FrozenEvidence("ab" * 16, 60.0, 1.0)
    backend_io.default_verifier(config, evidence=lambda b: ev)(config.backends[0])

    def broken(_b: Backend) -> FrozenEvidence | None:
        raise RuntimeError("boom")
    assert backend_io.default_verifier(config, evidence=broken)(config.backends[0]).outcome == "idle_ok"
    assert seen == [ev, None]


def test_the_verifier_times_its_readings_on_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frozen counters of an engine whose steps take up to 100 s prove a stall only over 200 s. With the wall
    clock, an NTP step of +600 s during the verification made 10 real seconds look like 610: no_progress,
    and a restart of a server that may only be in a long step."""
    import types

    real = [1000.0]
    wall = [1.7e9]
    frozen = Observation(ReadResult.OK, Reading("v1", {"0": EngineReading(2, 0, 0.5, {"generation_tokens": 500.0})},
                                                process_start=1000.0, step_seconds=100.0))
    looks: list[float] = []

    def observe(_target: Any) -> Observation:
        looks.append(real[0])
        if len(looks) == 2:
            wall[0] += 600.0                 # NTP steps the wall clock forward 10 minutes
        return frozen

    def sleep(s: float) -> None:
        real[0] += s
        wall[0] += s

    fake_time = types.SimpleNamespace(sleep=sleep, monotonic=lambda: real[0], time=lambda: wall[0])
    monkeypatch.setattr(check, "observe", observe)
    monkeypatch.setattr(backend_io, "time", fake_time)
    config = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                           "exporter": {"stall_ceiling": 900}})
    v = backend_io.default_verifier(config)(config.backends[0])
    assert v.outcome == "no_progress", v
    assert looks[-1] - looks[0] >= 200 - 1e-6, (looks[-1] - looks[0], v.reason)
