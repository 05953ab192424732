"""The canary's gate (remediator/rollout/gate.py): pure judgements of what Prometheus showed."""

from __future__ import annotations

import pytest

from llm_health.exporter.verdict import Verdict
from llm_health.remediator.rollout.gate import (
    Bounds,
    BoundsError,
    GateVerdict,
    Measurement,
    Summary,
    final,
    watch,
)

B = Bounds(min_requests=10, ttft_p95_ratio=1.5, e2e_p95_ratio=1.5, latency_slack=0.05, error_ratio_delta=0.01,
           max_inconclusive=3)
GOOD = Summary(requests=40, probes=2, error_ratio=0.0, fleet_error_ratio=0.0, ttft_p95=0.2, fleet_ttft_p95=0.2,
               e2e_p95=2.0, fleet_e2e_p95=2.0, fleet=3)


@pytest.mark.parametrize("verdict", [Verdict.STALLED, Verdict.DOWN])
def test_a_stalled_or_down_canary_fails_at_once(verdict: Verdict) -> None:
    check = watch(B, Measurement(verdict=verdict), 0, 0)
    assert check.verdict == GateVerdict.FAIL and verdict.value in check.reason


@pytest.mark.parametrize("verdict", [Verdict.IDLE, Verdict.BUSY, Verdict.RESTARTED])
def test_a_working_canary_waits_and_resets_the_counts(verdict: Verdict) -> None:
    check = watch(B, Measurement(verdict=verdict), 2, 2)
    assert check.verdict == GateVerdict.WAIT and (check.query_errors, check.inconclusive) == (0, 0)


def test_no_verdict_is_inconclusive_and_fails_only_after_the_limit() -> None:
    inconclusive = 0
    for seen in (None, Verdict.UNKNOWN):
        check = watch(B, Measurement(verdict=seen), 0, inconclusive)
        assert check.verdict == GateVerdict.WAIT
        inconclusive = check.inconclusive
    check = watch(B, Measurement(verdict=Verdict.NO_METRICS), 0, inconclusive)
    assert check.verdict == GateVerdict.FAIL and "not been seen working" in check.reason and check.inconclusive == 3


def test_query_errors_fail_after_four_in_a_row() -> None:
    errors = 0
    for _ in range(3):
        check = watch(B, Measurement(error="connection refused"), errors, 0)
        assert check.verdict == GateVerdict.WAIT
        errors = check.query_errors
    check = watch(B, Measurement(error="connection refused"), errors, 0)
    assert check.verdict == GateVerdict.FAIL and "4 gate queries in a row failed" in check.reason


def test_a_canary_like_the_fleet_passes_and_says_what_it_compared() -> None:
    verdict, reason = final(B, GOOD)
    assert verdict == GateVerdict.PASS and "40 user request(s)" in reason and "TTFT p95 0.200s" in reason


def test_no_traffic_fails_unless_passing_without_traffic_was_asked_for() -> None:
    quiet = Summary(requests=3, probes=5, fleet=3)
    verdict, reason = final(B, quiet)
    assert verdict == GateVerdict.FAIL and "no user traffic: 3 request(s) besides 5 idle probe(s)" in reason
    verdict, reason = final(Bounds(pass_without_traffic=True), quiet)
    assert verdict == GateVerdict.PASS and "passed anyway" in reason
    assert final(B, Summary(requests=None, fleet=3))[0] == GateVerdict.FAIL        # no data is no traffic


def test_a_latency_regression_fails_within_slack_passes() -> None:
    slow = Summary(**{**GOOD.__dict__, "ttft_p95": 0.5})
    verdict, reason = final(B, slow)
    assert verdict == GateVerdict.FAIL and "TTFT p95 0.500s vs the fleet's 0.200s (at most 1.5x)" in reason
    tiny = Summary(**{**GOOD.__dict__, "ttft_p95": 0.04, "fleet_ttft_p95": 0.01})   # 4x, but 30 ms apart
    assert final(B, tiny)[0] == GateVerdict.PASS
    e2e = Summary(**{**GOOD.__dict__, "e2e_p95": 3.1})
    assert "end-to-end p95" in final(B, e2e)[1]


def test_errors_above_the_fleet_fail_and_missing_canary_data_fails_when_the_fleet_has_it() -> None:
    assert final(B, Summary(**{**GOOD.__dict__, "error_ratio": 0.05}))[0] == GateVerdict.FAIL
    assert final(B, Summary(**{**GOOD.__dict__, "error_ratio": 0.005}))[0] == GateVerdict.PASS
    verdict, reason = final(B, Summary(**{**GOOD.__dict__, "ttft_p95": None}))
    assert verdict == GateVerdict.FAIL and "no TTFT p95 data for the canary" in reason


def test_a_fleet_without_data_skips_that_bound_and_says_so() -> None:
    alone = Summary(requests=40, error_ratio=0.0, ttft_p95=0.3, e2e_p95=2.0, fleet=0)
    verdict, reason = final(B, alone)
    assert verdict == GateVerdict.PASS and "TTFT p95 not compared: the fleet has no data" in reason


def test_a_failed_summary_query_fails() -> None:
    assert final(B, Summary(error="HTTP 503"))[0] == GateVerdict.FAIL


@pytest.mark.parametrize("raw, message", [
    ({"interval": 0}, "gate.interval"), ({"ttft_p95_ratio": 0.9}, "ttft_p95_ratio"), ({"min_requests": 0}, "min_requests"),
    ({"pass_without_traffic": 1}, "true or false"), ({"bogus": 1}, "unknown gate setting"), ({"min_requests": 2.5}, "whole"),
    ({"latency_slack": float("nan")}, "must be a number"), ({"error_ratio_delta": 2}, "error_ratio_delta"),
])
def test_bad_bounds_are_refused_by_name(raw: dict[str, object], message: str) -> None:
    with pytest.raises(BoundsError, match=message):
        Bounds.from_dict(raw)


def test_bounds_round_trip() -> None:
    b = Bounds(interval=5, min_requests=3, pass_without_traffic=True)
    assert Bounds.from_dict(b.as_dict()) == b
