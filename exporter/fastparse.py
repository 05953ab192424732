"""The page the exporter reads at every reading, without looking at most of its lines.

`parse_fast(text, keep, helps)` returns what `parser.parse(text, keep, helps)` returns: the same samples
in the same order, the same HELP texts and name prefixes (the line counts are counted by `parse()`
itself, if anyone asks). An ~80 KB vLLM page is mostly the buckets of histograms the exporter never
reads, and `parse()` still splits every line of them. Here:

* The page is cut at its `# HELP` lines: one family each (its HELP, TYPE and sample lines). The comment
  lines at its head are passed over (they hold nothing but HELP texts, read apart). Sample lines shorter
  than `BLOCK_BYTES` in all are read line by line by `parser.parse_lines`, the one line reader.
* A longer family's sample lines are a block. Its family name F is the first line's name without a
  histogram or counter suffix (`_bucket`, `_total`, ...), and the block is F's when every line starts
  with F (checked at C speed: no newline is left once every `\\nF` is taken out). Then only the lines
  that can hold a kept name go to `parse_lines`: those starting with a kept name that starts with F
  (and '{' or ' '), and those holding the suffix of a (prefix, suffix) rule that F allows (`vllm:` ...
  `_created`). The other lines are never split; their name prefix is F's (`vllm`), added once.
* Anything else (a block that is not one family's, leading blanks, an empty line, a name that is not a
  metric name, a ':' in a block whose F has none) is read line by line: slower, the same result.
* HELP texts: every line holding `# HELP <name>` for a name in `helps` is read as `parse()` reads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from llm_health.exporter.parser import Page, help_line, parse_lines

BLOCK_BYTES = 768            # a family's lines this long or longer are a block (shorter: line by line is cheaper)
SUFFIXES = ("_bucket", "_total", "_created", "_count", "_sum", "_gcount", "_gsum", "_info")
NEXT_FAMILY = "\n# HELP "
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NEXT_SAMPLE_LINE = re.compile(r"\n[^#]")     # the first line after comment lines that is not one
# a line's name as parse_lines() finds it, when it is a metric name ended by '{', or by ' ' and more
_FIRST_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| (?=\S))")
_CACHE_MAX = 4096


class Family:
    """What a block whose every line starts with `name` may keep, for a `Names`: the line starts of the kept
    names starting with `name` (`name_bucket{`, `name_bucket `), the rules' suffixes a name starting with
    `name` may end with, where `name`'s first ':' is."""

    __slots__ = ("colon", "name", "needles", "suffixes")

    def __init__(self, name: str, exact: tuple[str, ...], suffixes: tuple[str, ...]) -> None:
        self.name = name
        self.needles = tuple(n + "{" for n in exact) + tuple(n + " " for n in exact)
        self.suffixes = suffixes
        self.colon = name.find(":")


class Names:
    """The metric names to keep: `exact` names, and names with one of the `rules`' (prefix, suffix). A
    predicate for `parser.parse()`; `parse_fast()` also asks which kept names a family can hold."""

    def __init__(self, exact: Iterable[str], rules: Iterable[tuple[str, str]] = ()) -> None:
        self.exact = frozenset(exact)
        self.rules = tuple(rules)
        self._decided: dict[str, bool] = {}
        self._families: dict[str, Family | None] = {}

    def __call__(self, name: str) -> bool:
        kept = self._decided.get(name)
        if kept is None:
            kept = name in self.exact or any(name.startswith(p) and name.endswith(s) for p, s in self.rules)
            _remember(self._decided, name, kept)
        return kept

    def family_of(self, sample_name: str) -> Family | None:
        """The family of a block whose first line has this name: the name without a histogram or counter
        suffix. None when that is no metric name."""
        fam = self._families.get(sample_name, _UNKNOWN)
        if fam is not _UNKNOWN:
            return fam                      # type: ignore[return-value]
        name = sample_name
        for suffix in SUFFIXES:
            if name.endswith(suffix):
                name = name[:-len(suffix)]
                break
        fam = None
        if _METRIC_NAME.fullmatch(name):
            fam = Family(name, tuple(sorted(n for n in self.exact if n.startswith(name))),
                         tuple(s for p, s in self.rules if name.startswith(p) or p.startswith(name)))
        _remember(self._families, sample_name, fam)
        return fam


_UNKNOWN = object()


def _remember(cache: dict, key: str, value: object) -> None:
    if len(cache) >= _CACHE_MAX:            # a page inventing names: forget, never grow without bound
        cache.clear()
    cache[key] = value


def parse_fast(text: str, keep: Names, helps: tuple[str, ...] = ()) -> Page:
    """`parser.parse(text, keep, helps)`, reading only the lines that may hold a kept name."""
    page = Page(_source=(text, keep, helps))
    if helps:
        _helps(text, helps, page)
    n = len(text)
    if n and text[n - 1] == "\n":
        n -= 1                              # the empty line after the last newline: parse() skips it too
    read: list[str] = []                    # the lines parse_lines() reads, in page order
    pos = 0
    while pos < n:                          # a family at a time: [pos, stop)
        stop = text.find(NEXT_FAMILY, pos, n)
        if stop < 0:
            stop = n
        start = pos                         # its sample lines: after its comment lines (nothing in them)
        if text[start] == "#":
            m = _NEXT_SAMPLE_LINE.search(text, start, stop)
            start = stop if m is None else m.start() + 1
        if stop - start >= BLOCK_BYTES:
            _block(text, start, stop, keep, page, read)
        elif start < stop:
            read += text[start:stop].split("\n")
        pos = stop + 1
    parse_lines(read, keep, (), page)
    return page


def _helps(text: str, helps: tuple[str, ...], page: Page) -> None:
    """Every line holding `# HELP <name>` for a name in `helps`, in page order (a later HELP wins, as in
    `parse()`); `help_line` reads it as `parse()` would."""
    spans: set[tuple[int, int]] = set()
    for name in helps:
        needle = "# HELP " + name
        i = text.find(needle)
        while i >= 0:
            start = text.rfind("\n", 0, i) + 1
            end = text.find("\n", i)
            if end < 0:
                end = len(text)
            spans.add((start, end))
            i = text.find(needle, end)
    for start, end in sorted(spans):
        help_line(text[start:end], helps, page)


def _block(text: str, start: int, end: int, keep: Names, page: Page, read: list[str]) -> None:
    """Lines [start, end), the first no comment line: the lines to read go to `read`."""
    first = _FIRST_NAME.match(text, start, end)
    fam = None if first is None else keep.family_of(first[1])
    block = text[start:end]
    if fam is None or "\n" in block.replace("\n" + fam.name, ""):
        read += block.split("\n")                       # not one family's lines: every line
        return
    # every line starts with the family's name (a metric name: no blank, no brace), so every name does;
    # the first line has a name (what _FIRST_NAME matched survives parse_lines' strip of trailing blanks)
    if fam.colon > 0:
        page.prefixes.add(fam.name[:fam.colon])
    elif fam.colon < 0 and ":" in block:
        read += block.split("\n")                       # a ':' after the family's name in some name, maybe
        return
    needles, suffixes = fam.needles, fam.suffixes
    if needles:                                          # lines of kept names: they start with one + '{' or ' '
        lines = block.split("\n")
        if not suffixes:
            read += [ln for ln in lines if ln.startswith(needles)]
        elif len(suffixes) == 1:
            suffix = suffixes[0]
            read += [ln for ln in lines if ln.startswith(needles) or suffix in ln]
        else:
            read += [ln for ln in lines if ln.startswith(needles) or any(s in ln for s in suffixes)]
        return
    if not suffixes:
        return
    starts: set[int] = set()                             # lines that may hold a name with a rule's suffix
    for suffix in suffixes:
        i = block.find(suffix)
        while i >= 0:
            starts.add(block.rfind("\n", 0, i) + 1)
            nl = block.find("\n", i)
            if nl < 0:
                break
            i = block.find(suffix, nl + 1)
    for s in sorted(starts):
        nl = block.find("\n", s)
        read.append(block[s:] if nl < 0 else block[s:nl])
