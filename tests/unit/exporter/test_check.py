"""exporter/check.py verify() and its probes against `FakeVllm` (tests/support/fakevllm.py): the API key,
every engine judged like the exporter does, probes counted when sent."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_health.config import Backend, ExporterSettings
from llm_health.drill.procs import llm_health, wait_until
from llm_health.exporter.check import verify
from llm_health.exporter.scheduler import ReadScheduler
from tests.support.fakevllm import KEY, KW


def test_verify_and_check_with_an_api_key(fake, tmp_path: Path) -> None:
    f = fake(api_key=KEY)
    v = verify(f.url, **KW)  # the model comes from /v1/models, which rejects us already
    assert v.outcome == "unknown", v
    assert "probe rejected: /v1/models: HTTP 401 — set exporter.api_key_file?" in v.reason
    v = verify(f.url, **KW, model="m")  # the completion itself is rejected
    assert v.outcome == "unknown", v
    assert "probe rejected: HTTP 401 — set exporter.api_key_file?" in v.reason
    v = verify(f.url, **KW, api_key=KEY)
    assert v.outcome == "idle_ok", v
    assert f.probes == 1  # the rejected one never reached the model; the authorized one did
    # /metrics and /health stay unauthenticated; /v1/* carried the key
    assert f.auth["/metrics"] and not any(f.auth["/metrics"])
    assert any(f.auth["/v1/completions"])

    keyfile = tmp_path / "key"
    keyfile.write_text(KEY + "\n")
    ok = subprocess.run(llm_health("check", f.url, "--interval", 0.2, "--timeout", 0.5, "--api-key-file", keyfile),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: idle"), ok.stdout + ok.stderr
    bad = subprocess.run(llm_health("check", f.url, "--interval", 0.2, "--timeout", 0.5),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "probe rejected: /v1/models: HTTP 401" in bad.stdout, bad.stdout + bad.stderr
    missing = subprocess.run(llm_health("check", f.url, "--api-key-file", tmp_path / "nope"),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--api-key-file" in missing.stderr


# ------------------------------------------------------------------------------------ 2. stale reads


# ------------------------------------------------------------------------------------ 3. per-engine verify


def test_verify_judges_every_engine_like_the_exporter(fake) -> None:
    f = fake()
    f.set("0", running=2, gen=100)
    f.set("1", running=3, gen=500)

    def step(gen0: float, gen1: float, running1: float = 3) -> Callable[[float], None]:
        return lambda _s: (f.set("0", running=2, gen=gen0), f.set("1", running=running1, gen=gen1))

    # engine 0 moves, engine 1 (with work) is frozen: no_progress, and the reason names engine 1
    v = verify(f.url, **{**KW, "sleep": step(180, 500)})
    assert v.outcome == "no_progress", v
    assert v.reason.startswith("engine 1: 3 running"), v
    # both move: progress
    f.set("1", running=3, gen=500)
    v = verify(f.url, **{**KW, "sleep": step(260, 600)})
    assert v.outcome == "progress" and v.in_flight == 5, v
    # an engine without work may be quiet
    f.set("1", running=0, gen=600)
    v = verify(f.url, **{**KW, "sleep": step(340, 600, running1=0)})
    assert v.outcome == "progress" and v.in_flight == 2, v
    # engine 1 got work between the readings and has not moved yet: cannot tell
    v = verify(f.url, **{**KW, "sleep": step(420, 600, running1=1)})
    assert v.outcome == "unknown" and "engine 1" in v.reason, v
    assert f.probes == 0


# ------------------------------------------------------------------------------------ 4. probes counted when sent


def test_probes_are_counted_when_sent(fake) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from llm_health.exporter.collector import ExporterCollector

    f = fake()
    f.hold_completions.set()  # the probe is sent but not answered yet
    fleet = ReadScheduler([Backend(name="a", url=f.url)], [],
                  ExporterSettings(interval=0.3, read_timeout=1.0, probe_timeout=5.0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(fleet.snapshot))
    try:
        fleet.read_all(due=0.0)
        wait_until(lambda: f.probes == 1, timeout=5, what="probe sent")
        text = generate_latest(registry).decode()
        assert 'llm_health_probes_sent_total{backend="a"} 1.0' in text
        for result in ("ok", "error", "timeout"):
            assert f'llm_health_probes_total{{backend="a",result="{result}"}} 0.0' in text
        f.hold_completions.clear()
        slot = fleet.backends[0]
        wait_until(slot.probe.done, timeout=5, what="probe answered")
        fleet.read_all(due=0.1)  # too soon for another probe; the answer is counted
        text = generate_latest(registry).decode()
        assert 'llm_health_probes_sent_total{backend="a"} 1.0' in text
        assert 'llm_health_probes_total{backend="a",result="ok"} 1.0' in text
    finally:
        f.hold_completions.clear()
        fleet.close()


# ------------------------------------------------------------------------------------ 5. unresponsive, 7. slow


def test_a_llamacpp_whose_models_hang_too_is_stalled_only_with_the_exporters_evidence(monkeypatch) -> None:
    """llama.cpp's loop stopped holding its queue's lock (seen on CI): /metrics and /v1/models time out,
    /health answers. Nothing fresh says which engine this is: unknown (fail closed), unless the exporter,
    which judges it stalled from its pages, says those pages come from llama.cpp's loop."""
    from llm_health.exporter import check
    from llm_health.exporter.observation import FrozenEvidence, Observation, ReadResult, VerifyOutcome
    from llm_health.http_client import HttpFailure

    monkeypatch.setattr(check, "observe", lambda _t: Observation(ReadResult.TIMEOUT, detail="no answer within 1 s"))
    monkeypatch.setattr(check, "answers", lambda _t: True)
    owner: list[Any] = [HttpFailure("timeout", "/v1/models: no answer within 1 s")]

    def models(_t: Any) -> dict[str, Any]:
        if isinstance(owner[0], Exception):
            raise owner[0]
        return {"id": "m", "owned_by": owner[0]}

    monkeypatch.setattr(check, "first_model_entry", models)

    def run(evidence: FrozenEvidence | None) -> Any:
        return verify("http://127.0.0.1:1", readings=3, interval=0.0, read_timeout=1, probe_timeout=1,
                      sleep=lambda _s: None, evidence=evidence)

    loop = FrozenEvidence("ab" * 16, 30.0, 0.0, page_is_work_queue=True)
    assert run(None).outcome == VerifyOutcome.UNKNOWN
    assert run(FrozenEvidence("ab" * 16, 30.0, 0.0)).outcome == VerifyOutcome.UNKNOWN   # not llama.cpp's pages
    v = run(loop)
    assert v.outcome == VerifyOutcome.NO_PROGRESS and "/v1/models timed out too" in v.reason, v
    # /v1/models answered: what it says decides, whatever the evidence
    owner[0] = "vllm"
    assert run(loop).outcome == VerifyOutcome.UNKNOWN
    owner[0] = "llamacpp"
    assert run(None).outcome == VerifyOutcome.NO_PROGRESS
    owner[0] = HttpFailure("error", "/v1/models: HTTP 500", 500)    # an error is no timeout: not the lock
    assert run(loop).outcome == VerifyOutcome.UNKNOWN


IDLE_PAGE = ('vllm:num_requests_running{engine="0",model_name="m"} 0\n'
             'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
             'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
             'vllm:generation_tokens_total{engine="0",model_name="m"} 500\n'
             "process_start_time_seconds 1000\n")
ASLEEP_PAGE = IDLE_PAGE + ('vllm:engine_sleep_state{engine="0",sleep_state="awake"} 0\n'
                           'vllm:engine_sleep_state{engine="0",sleep_state="weights_offloaded"} 1\n')


class _Probes:
    """Stands in for check.Prober: counts what went out, answers `answer`."""

    sent = 0
    answer: Any = None

    def __init__(self, *_a: Any, **_k: Any) -> None:
        pass

    def probe(self) -> Any:
        _Probes.sent += 1
        return _Probes.answer

    def close(self) -> None:
        pass


def _verify_with(monkeypatch, looks: Any, answer: Any) -> Any:
    from llm_health.exporter import check

    monkeypatch.setattr(check, "observe", lambda _target: next(looks))
    monkeypatch.setattr(check, "Prober", _Probes)
    _Probes.sent, _Probes.answer = 0, answer
    return check.verify("http://127.0.0.1:9", readings=2, interval=0.0, sleep=lambda _s: None)


def test_no_probe_on_an_older_idle_page_when_the_latest_look_failed(monkeypatch) -> None:
    """Readings [idle, /metrics timeout]: a vLLM slow under new work. The probe went out on the older page."""
    from llm_health.exporter.observation import Observation, ProbeOutcome, ProbeResult, ReadResult
    from llm_health.exporter.reading import read_text

    looks = iter([Observation(ReadResult.OK, read_text(IDLE_PAGE)),
                  Observation(ReadResult.TIMEOUT, detail="no answer within 5 s")])
    v = _verify_with(monkeypatch, looks, ProbeResult(ProbeOutcome.OK, "", 0.01))
    assert _Probes.sent == 0 and v.outcome == "unknown" and "older page" in v.reason, v


def test_the_retry_probe_never_goes_to_an_engine_gone_to_sleep(monkeypatch) -> None:
    """The first probe fails (the server was going to sleep); the fresh reading says asleep: no second one."""
    import itertools

    from llm_health.exporter.observation import Observation, ProbeOutcome, ProbeResult, ReadResult
    from llm_health.exporter.reading import read_text

    looks = itertools.chain([Observation(ReadResult.OK, read_text(IDLE_PAGE))] * 2,
                            itertools.repeat(Observation(ReadResult.OK, read_text(ASLEEP_PAGE))))
    v = _verify_with(monkeypatch, looks, ProbeResult(ProbeOutcome.ERROR, "HTTP 500", 0.01, 500))
    assert _Probes.sent == 1 and v.outcome == "unknown", v
