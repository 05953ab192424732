"""Prometheus exposition text -> samples: fast, tolerant, and keeping only what we need.

At 1000 backends the exporter parses 1000 pages per interval, most of whose lines are histogram
buckets it never looks at. So the parser decides from the metric name alone (a set lookup)
whether a line is worth splitting into labels and a value. Comment lines are skipped, except the
`# HELP` of names the caller asks for (vLLM's HELP text tells V0 from V1).

Tolerance: a malformed line is skipped, never fatal (a half-broken page still yields the rest).
Values are parsed like prometheus_client does (`+Inf`, `-Inf`, `NaN`, Go float syntax); a
trailing timestamp is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container
from dataclasses import dataclass, field

Labels = dict[str, str]

_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,)?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float


@dataclass
class Page:
    samples: list[Sample] = field(default_factory=list)
    helps: dict[str, str] = field(default_factory=dict)
    prefixes: set[str] = field(default_factory=set)   # "vllm", "sglang", ... (the part before ':')
    lines: int = 0
    skipped: int = 0                                  # malformed lines


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def _parse_labels(line: str, start: int) -> tuple[Labels, int] | None:
    """Labels starting after the '{' at `start`; returns (labels, index after '}') or None."""
    labels: Labels = {}
    pos = start + 1
    n = len(line)
    while True:
        while pos < n and line[pos] == " ":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_RE.match(line, pos)
        if m is None:
            return None
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
        if m.group(3) is None:
            while pos < n and line[pos] == " ":
                pos += 1
            if pos < n and line[pos] == "}":
                return labels, pos + 1
            return None


def parse_value(text: str) -> float:
    return float(text)  # Python's float() accepts +Inf, -Inf, NaN, 1e+09, 1.5


def parse(
    text: str,
    keep: Container[str] | Callable[[str], bool] | None = None,
    helps: Container[str] = (),
) -> Page:
    """Parse exposition text. `keep`: the metric names (a set, or a predicate) to return; None = all."""
    page = Page()
    if keep is None:
        def wanted(_name: str) -> bool:
            return True
    elif callable(keep):
        wanted = keep
    else:
        wanted = keep.__contains__
    samples = page.samples
    prefixes = page.prefixes
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] in " \t" or line[-1] in " \t\r":
            line = line.strip()
            if not line:
                continue
        page.lines += 1
        if line[0] == "#":
            if helps and line.startswith("# HELP "):
                parts = line[7:].split(" ", 1)
                if parts[0] in helps:
                    page.helps[parts[0]] = parts[1] if len(parts) > 1 else ""
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
        elif space != -1:
            name = line[:space]
        else:
            page.skipped += 1
            continue
        colon = name.find(":")
        if colon > 0:
            prefixes.add(name[:colon])
        if not wanted(name):
            continue
        if brace != -1 and (space == -1 or brace < space):
            parsed = _parse_labels(line, brace)
            if parsed is None:
                page.skipped += 1
                continue
            labels, end = parsed
            rest = line[end:].split()
        else:
            labels = {}
            rest = line[space:].split()
        if not rest:
            page.skipped += 1
            continue
        try:
            value = float(rest[0])
        except ValueError:
            page.skipped += 1
            continue
        samples.append(Sample(name, labels, value))
    return page
