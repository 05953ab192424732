"""Prometheus exposition text -> samples: fast, tolerant, and keeping only what we need.

`parse()` looks at every line: it decides from the metric name alone (a set lookup) whether a line is
worth splitting into labels and a value. Comment lines are skipped, except the `# HELP` of names the
caller asks for (vLLM's HELP text tells V0 from V1). It is the reference: `exporter/fastparse.py`
gives the same page without looking at most lines (what the exporter calls at every reading).

Tolerance: a malformed line is skipped, never fatal (a half-broken page still yields the rest).
Values are parsed like prometheus_client does (`+Inf`, `-Inf`, `NaN`, Go float syntax); a
trailing timestamp is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

Labels = dict[str, str]
Keep = Container[str] | Callable[[str], bool] | None

_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,)?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')
_FIRST_KEY_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*=")      # `engine=` before a label's first quote
_NEXT_KEY_RE = re.compile(r",[a-zA-Z_][a-zA-Z0-9_]*=")      # `,le=` before the next ones
_KEYS_MAX = 4096
_first_keys: dict[str, str] = {}     # `engine=` -> `engine`: label names already checked (names, never values)
_next_keys: dict[str, str] = {}      # `,le=` -> `le`


class Sample(NamedTuple):
    name: str
    labels: Labels
    value: float


_new_sample = tuple.__new__          # Sample(...) without the generated __new__ (a page has hundreds)


@dataclass
class Page:
    samples: list[Sample] = field(default_factory=list)
    helps: dict[str, str] = field(default_factory=dict)
    prefixes: set[str] = field(default_factory=set)   # "vllm", "sglang", ... (the part before ':')
    # (lines, malformed lines) as parse() counts them; None: counted from `_source` when first asked
    _counts: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    _source: tuple[str, Keep, Container[str]] | None = field(default=None, repr=False, compare=False)

    @property
    def lines(self) -> int:
        return self._tally()[0]

    @property
    def skipped(self) -> int:
        """Malformed lines (skipped, never fatal)."""
        return self._tally()[1]

    def _tally(self) -> tuple[int, int]:
        if self._counts is None:
            assert self._source is not None
            text, keep, helps = self._source
            self._counts = parse(text, keep, helps)._tally()
        return self._counts


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def _label_name(key: str, first: bool) -> str | None:
    """`engine=` (first label) or `,le=` (the next ones) -> the label name; None if not that form."""
    keys = _first_keys if first else _next_keys
    name = keys.get(key)
    if name is None:
        if (_FIRST_KEY_RE if first else _NEXT_KEY_RE).fullmatch(key) is None:
            return None
        name = key[:-1] if first else key[1:-1]
        if len(keys) >= _KEYS_MAX:     # a page inventing label names: forget, never grow without bound
            keys.clear()
        keys[key] = name
    return name


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


def predicate(keep: Keep) -> Callable[[str], bool]:
    if keep is None:
        def everything(_name: str) -> bool:
            return True
        return everything
    if callable(keep):
        return keep
    return keep.__contains__


def parse(text: str, keep: Keep = None, helps: Container[str] = ()) -> Page:
    """Parse exposition text. `keep`: the metric names (a set, or a predicate) to return; None = all."""
    page = Page()
    page._counts = parse_lines(text.split("\n"), predicate(keep), helps, page)
    return page


def parse_lines(lines: Iterable[str], wanted: Callable[[str], bool], helps: Container[str], page: Page) -> tuple[
        int, int]:
    """Every line into `page` (samples of wanted names, prefixes, helps); returns (lines, malformed lines).
    The one place that reads a line: `parse()` gives it all of them, the fast path those it must read.

    Two things are remembered from line to line, as what they decide is the same: the last labelled
    line's `name{` (a line starting with it has that name, so the same prefix and the same keep/skip:
    a histogram's buckets), and the last label keys checked (`engine=`, `,le=`, ...: the same names)."""
    samples = page.samples
    prefixes = page.prefixes
    exact: Container[str] = getattr(wanted, "exact", ())    # Names: its exact names need no call
    first_keys, next_keys = _first_keys, _next_keys
    count = skipped = 0
    head, head_name, head_kept = "\n", "", False          # the last labelled line's `name{` ("\n": none yet,
    # as no line holds a newline)
    known_keys: list[str] = []
    known_names: list[str] | None = None
    for line in lines:
        if not line:
            continue
        if line[0] in " \t" or line[-1] in " \t\r":
            line = line.strip()
            if not line:
                continue
        count += 1
        if line[0] == "#":
            if helps and line.startswith("# HELP "):
                _record_help(line, helps, page)
            continue
        if line.startswith(head):
            # `name{` as the last labelled line (name: no blank, no brace): the same name, prefix and choice
            if not head_kept:
                continue
            name = head_name
            brace = len(name)
        else:
            brace = line.find("{")
            space = line.find(" ")
            if brace != -1 and (space == -1 or brace < space):
                name = line[:brace]
                colon = name.find(":")
                if colon > 0:
                    prefixes.add(name[:colon])
                head, head_name = name + "{", name
                head_kept = name in exact or wanted(name)
                if not head_kept:
                    continue
            elif space != -1:
                name = line[:space]
                colon = name.find(":")
                if colon > 0:
                    prefixes.add(name[:colon])
                if name not in exact and not wanted(name):
                    continue
                rest = line[space:].split()
                if not rest:
                    skipped += 1
                    continue
                try:
                    value = float(rest[0])
                except ValueError:
                    skipped += 1
                    continue
                samples.append(_new_sample(Sample, (name, {}, value)))
                continue
            else:
                skipped += 1
                continue
        # labels in the form every engine writes, {a="x",b="y"} (no blank, no backslash), split at the quotes
        # here; anything else goes to _parse_labels (which reads that form the same way)
        labels: Labels | None = None
        if "\\" not in line:
            parts = line[brace + 1:].split('"')     # key, value, key, value, ..., after the last quote
            last = len(parts) - 1
            if not last & 1:
                keys = parts[0:last:2]
                if keys != known_keys or known_names is None:
                    known_keys, known_names = keys, []
                    for i, key in enumerate(keys):
                        label = (next_keys if i else first_keys).get(key) or _label_name(key, not i)
                        if label is None:
                            known_names = None
                            break
                        known_names.append(label)
                if known_names is not None:
                    tail = parts[last]
                    if tail[:1] == "}":
                        rest = tail[1:].split()
                        labels = dict(zip(known_names, parts[1:last:2], strict=True))
                    elif last and tail[:2] == ",}":
                        rest = tail[2:].split()
                        labels = dict(zip(known_names, parts[1:last:2], strict=True))
        if labels is None:
            parsed = _parse_labels(line, brace)
            if parsed is None:
                skipped += 1
                continue
            labels, end = parsed
            rest = line[end:].split()
        if not rest:
            skipped += 1
            continue
        try:
            value = float(rest[0])
        except ValueError:
            skipped += 1
            continue
        samples.append(_new_sample(Sample, (name, labels, value)))
    return count, skipped


def _record_help(line: str, helps: Container[str], page: Page) -> None:
    parts = line[7:].split(" ", 1)
    if parts[0] in helps:
        page.helps[parts[0]] = parts[1] if len(parts) > 1 else ""


def help_line(line: str, helps: Container[str], page: Page) -> None:
    """What `parse_lines` does with this line's HELP text, and nothing else (the fast path reads the HELP
    lines apart from the samples)."""
    if line and (line[0] in " \t" or line[-1] in " \t\r"):
        line = line.strip()
    if line.startswith("# HELP "):
        _record_help(line, helps, page)
