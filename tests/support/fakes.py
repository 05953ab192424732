"""Test doubles shared by the pure-logic tests."""

from __future__ import annotations


class FakeClock:
    """An injected clock that moves only when the test says so."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def has_sample(text: str, line: str) -> bool:
    """True when the Prometheus exposition `text` has the sample written as `name{labels} value`
    (values compared as numbers: `1` matches `1.0`, `1000000.000` matches `1e+06`)."""
    from prometheus_client.parser import text_string_to_metric_families

    key, _, value = line.rpartition(" ")
    name, _, rest = key.partition("{")
    wanted = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if part) if rest else {}
    wanted = {k: v.strip('"') for k, v in wanted.items()}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == wanted and s.value == float(value):
                return True
    return False
