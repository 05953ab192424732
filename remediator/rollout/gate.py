"""The canary's gate: pure judgements of what Prometheus showed, no I/O, no clock.

During the soak (`watch`, every `interval`): the exporter's verdict of the canary. `stalled` or `down` fails
the gate at once (the exporter already waited out its own grace periods: a verdict is never one reading);
no answer (no series, `unknown`, `no_metrics`, `sleeping`) is inconclusive and fails after
`max_inconclusive` measurements in a row; a query that errors fails after `max_query_errors` in a row
(Argo Rollouts' consecutiveErrorLimit, 4). A gate that cannot see is never a pass.

At the end of the soak (`final`), over the soak's window, the canary against the members not changed yet
(the fleet): it must have served user requests (its requests minus our own idle probes: at least
`min_requests`), since a canary that saw no traffic has not been verified (unless the rollout was started
with pass_without_traffic, said in the reason); its error ratio at most `error_ratio_delta` above the
fleet's; its TTFT p95 and end-to-end p95 at most `*_ratio` times the fleet's (a canary within
`latency_slack` seconds of the fleet passes whatever the ratio: histogram buckets are coarse). A bound
the fleet has no data for (no other member, or an engine without that metric) is skipped and said; a
bound the fleet has data for and the canary has not fails ("no data").
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from llm_health.exporter.verdict import Verdict


class GateVerdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    WAIT = "wait"          # nothing decided yet: measure again after `interval`


#: verdicts of the canary that fail the gate at once
FAILING = frozenset({Verdict.STALLED, Verdict.DOWN})
#: verdicts that say nothing about the new command (counted as inconclusive)
INCONCLUSIVE = frozenset({Verdict.UNKNOWN, Verdict.NO_METRICS, Verdict.SLEEPING})


class BoundsError(ValueError):
    """A gate setting out of range; the message names it."""


@dataclass(frozen=True)
class Bounds:
    interval: float = 30.0             # seconds between two measurements during the soak
    ttft_p95_ratio: float = 1.5        # canary TTFT p95 <= this x the fleet's
    e2e_p95_ratio: float = 1.5         # canary end-to-end p95 <= this x the fleet's
    latency_slack: float = 0.05        # seconds: within this of the fleet's p95 always passes
    error_ratio_delta: float = 0.01    # canary error ratio <= the fleet's + this
    min_requests: int = 10             # user requests the canary must have served during the soak
    pass_without_traffic: bool = False  # a canary without user traffic passes (said in the reason)
    max_query_errors: int = 4          # consecutive failed queries that fail the gate
    max_inconclusive: int = 5          # consecutive measurements without an answer that fail the gate

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Bounds:
        """Bounds from a mapping (a YAML plan, an API body, the store); unknown keys and bad values raise
        BoundsError naming them."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise BoundsError(f"unknown gate setting(s): {', '.join(unknown)}")
        default = cls()
        values: dict[str, Any] = {}
        for key, value in raw.items():
            want = type(getattr(default, key))
            if want is bool:
                if not isinstance(value, bool):
                    raise BoundsError(f"gate.{key}: must be true or false")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise BoundsError(f"gate.{key}: must be a number")
            elif want is int and value != int(value):
                raise BoundsError(f"gate.{key}: must be a whole number")
            values[key] = want(value)
        bounds = cls(**values)
        bounds.check()
        return bounds

    def check(self) -> None:
        if self.interval <= 0:
            raise BoundsError("gate.interval: must be > 0 seconds")
        if self.ttft_p95_ratio < 1 or self.e2e_p95_ratio < 1:
            raise BoundsError("gate.ttft_p95_ratio and gate.e2e_p95_ratio: must be >= 1 (the fleet's own value)")
        if self.latency_slack < 0 or not 0 <= self.error_ratio_delta <= 1:
            raise BoundsError("gate.latency_slack: must be >= 0; gate.error_ratio_delta in [0, 1]")
        if self.min_requests < 1:
            raise BoundsError("gate.min_requests: must be at least 1 (use pass_without_traffic to pass without)")
        if self.max_query_errors < 1 or self.max_inconclusive < 1:
            raise BoundsError("gate.max_query_errors and gate.max_inconclusive: must be at least 1")


@dataclass(frozen=True)
class Measurement:
    """One look at the canary during the soak."""

    verdict: Verdict | None = None     # the exporter's latest verdict; None: no series
    error: str = ""                    # the query failed (then verdict means nothing)


@dataclass(frozen=True)
class Check:
    verdict: GateVerdict               # FAIL or WAIT (a pass is only decided at the end of the soak)
    reason: str
    query_errors: int                  # the counts to store for the next measurement
    inconclusive: int


def watch(b: Bounds, m: Measurement, query_errors: int, inconclusive: int) -> Check:
    if m.error:
        n = query_errors + 1
        if n >= b.max_query_errors:
            return Check(GateVerdict.FAIL, f"{n} gate queries in a row failed (limit {b.max_query_errors}), the "
                         f"last: {m.error}", n, inconclusive)
        return Check(GateVerdict.WAIT, f"gate query failed ({n} of {b.max_query_errors} in a row): {m.error}", n,
                     inconclusive)
    if m.verdict in FAILING:
        return Check(GateVerdict.FAIL, f"the canary's verdict is {m.verdict.value}", 0, 0)
    if m.verdict is None or m.verdict in INCONCLUSIVE:
        n = inconclusive + 1
        seen = "no verdict series" if m.verdict is None else f"verdict {m.verdict.value}"
        if n >= b.max_inconclusive:
            return Check(GateVerdict.FAIL, f"the canary has not been seen working: {seen} in {n} measurements in "
                         f"a row (limit {b.max_inconclusive}); a canary the gate cannot see is not verified", 0, n)
        return Check(GateVerdict.WAIT, f"{seen} ({n} of {b.max_inconclusive} in a row)", 0, n)
    return Check(GateVerdict.WAIT, f"verdict {m.verdict.value}", 0, 0)


@dataclass(frozen=True)
class Summary:
    """The soak's window, canary against fleet (None: no data)."""

    requests: float | None = None      # user requests the canary finished (its requests minus our probes)
    probes: float = 0.0                # our idle probes to it
    error_ratio: float | None = None
    fleet_error_ratio: float | None = None
    ttft_p95: float | None = None
    fleet_ttft_p95: float | None = None
    e2e_p95: float | None = None
    fleet_e2e_p95: float | None = None
    fleet: int = 0                     # members the fleet's values come from
    error: str = ""                    # a query failed: nothing below can be judged


def _num(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def final(b: Bounds, s: Summary) -> tuple[GateVerdict, str]:
    """PASS or FAIL at the end of the soak, with every reason (the first failing one first)."""
    if s.error:
        return GateVerdict.FAIL, f"gate query failed at the end of the soak: {s.error}"
    fails: list[str] = []
    said: list[str] = []
    requests = s.requests if _num(s.requests) else 0.0
    if requests < b.min_requests:
        why = (f"no user traffic: {requests:g} request(s) besides {s.probes:g} idle probe(s) during the soak "
               f"(at least {b.min_requests} needed)")
        if b.pass_without_traffic:
            said.append(f"{why}; passed anyway: started with pass_without_traffic")
        else:
            fails.append(f"{why}: a canary without traffic has not been verified (start with "
                         "--pass-without-traffic to accept that)")
    else:
        said.append(f"{requests:g} user request(s)")
    if _num(s.fleet_error_ratio):
        if not _num(s.error_ratio):
            if requests >= b.min_requests:
                fails.append("no error-ratio data for the canary (the fleet has it)")
        elif s.error_ratio - s.fleet_error_ratio > b.error_ratio_delta:    # type: ignore[operator]
            fails.append(f"error ratio {s.error_ratio:.3f} vs the fleet's {s.fleet_error_ratio:.3f} (at most "
                         f"+{b.error_ratio_delta:g})")
        else:
            said.append(f"error ratio {s.error_ratio:.3f} (fleet {s.fleet_error_ratio:.3f})")
    else:
        said.append("error ratio not compared: the fleet has no data")
    for name, mine, theirs, ratio in (("TTFT p95", s.ttft_p95, s.fleet_ttft_p95, b.ttft_p95_ratio),
                                      ("end-to-end p95", s.e2e_p95, s.fleet_e2e_p95, b.e2e_p95_ratio)):
        if not _num(theirs):
            said.append(f"{name} not compared: the fleet has no data")
            continue
        if not _num(mine):
            if requests >= b.min_requests:
                fails.append(f"no {name} data for the canary (the fleet has it)")
            continue
        assert mine is not None and theirs is not None
        if mine > theirs * ratio and mine - theirs > b.latency_slack:
            fails.append(f"{name} {mine:.3f}s vs the fleet's {theirs:.3f}s (at most {ratio:g}x)")
        else:
            said.append(f"{name} {mine:.3f}s (fleet {theirs:.3f}s)")
    if fails:
        return GateVerdict.FAIL, "; ".join(fails)
    return GateVerdict.PASS, "; ".join(said)
