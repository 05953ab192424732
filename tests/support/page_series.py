"""Exposition pages -> promtool `input_series`: the rules tested on what a real engine served.

`page_samples(text)` reads a /metrics page line by line, wire names as Prometheus keeps them (no
renaming of counters, histograms as their `_bucket`/`_sum`/`_count` samples), independent of the
exporter's parser. `scrapes_to_series(pages, target)` turns a sequence of scrapes (one page per
scrape interval, None for a failed scrape) of one target into promtool series: every sample gets the
target's labels (a page label of the same name becomes `exported_<name>`, as Prometheus does without
honor_labels), `up` is 1 or 0 per scrape, a series missing from a scrape after having been there is
marked `stale` (as Prometheus does when a series disappears or a scrape fails), and repeated values
are written with promtool's `VxN` notation. Works for any engine's page (vLLM, SGLang, llama.cpp).

(No tests here: a helper module, imported by tests/rules/test_real_pages.py.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

Labels = tuple[tuple[str, str], ...]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _labels(text: str) -> Labels:
    out = []
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise ValueError(f"cannot read labels {text!r}")
            break
        value = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
        out.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(out))


def page_samples(text: str) -> dict[tuple[str, Labels], float]:
    """(wire name, sorted labels) -> value for every sample line of an exposition page."""
    out: dict[tuple[str, Labels], float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"not a sample line: {line!r}")
        out[(m.group(1), _labels(m.group(2) or ""))] = float(m.group(3))
    return out


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value) if value != int(value) or abs(value) >= 1e15 else str(int(value))


RAW = ("stale", "NaN", "+Inf", "-Inf")  # promtool takes them one by one only ("NaNx2" is a parse error)


def _encode(values: Sequence[str]) -> str:
    """promtool's notation, repeated values run-length encoded: "5 5 5 7" -> "5x2 7"."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i] and values[i] not in RAW:
            j += 1
        v, n = values[i], j - i
        parts.append(f"{v}x{n}" if n and v != "_" else " ".join([v] * (n + 1)))
        i = j + 1
    return " ".join(parts)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def series_text(name: str, labels: Labels | dict[str, str]) -> str:
    items = labels.items() if isinstance(labels, dict) else labels
    return name + "{" + ", ".join(f"{k}={_quote(v)}" for k, v in items) + "}"


def scrapes_to_series(pages: Sequence[str | None], target: dict[str, str],
                      keep: Callable[[str], bool] = lambda name: True) -> list[dict[str, str]]:
    """promtool input_series for one target scraped once per interval; `pages[i]` is what scrape i
    returned (None: the scrape failed). `keep(name)` selects metric names (default: all)."""
    read = [page_samples(p) if p is not None else None for p in pages]
    keys: list[tuple[str, Labels]] = []
    seen: set[tuple[str, Labels]] = set()
    for samples in read:
        for key in samples or {}:
            if key not in seen and keep(key[0]):
                seen.add(key)
                keys.append(key)
    out = [{"series": series_text("up", target),
            "values": _encode(["0" if s is None else "1" for s in read])}]
    for name, labels in keys:
        values: list[str] = []
        present = False
        for samples in read:
            if samples is not None and (name, labels) in samples:
                values.append(_number(samples[(name, labels)]))
                present = True
            else:
                values.append("stale" if present else "_")
                present = False
        merged = [(f"exported_{k}" if k in target else k, v) for k, v in labels]
        out.append({"series": series_text(name, {**target, **dict(merged)}), "values": _encode(values)})
    return out
