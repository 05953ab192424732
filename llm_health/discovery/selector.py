"""The discovery selector: `job="vllm", namespace=~"llm-.*"` -> matchers, applied to each target
(names starting with `__` read the target's discoveredLabels, `__scrape_pool__` its scrape pool).

Regex matchers mean what they mean in Prometheus: RE2 syntax, anchored as ^(?s:...)$ (llm_health/promregex.py);
a pattern RE2 refuses (backreferences, look-around, ...) is refused with the reason."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_health import promregex
from llm_health.config import ConfigError

MAX_SELECTOR_LENGTH = 2000
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


_OPS = ("=~", "!~", "!=", "=")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str            # = != =~ !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label, "")   # as in PromQL: a missing label is the empty string
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = promregex.matches(self.value, have)            # RE2, anchored as in PromQL
        return hit if self.op == "=~" else not hit


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """`job="vllm", namespace=~"llm-.*"` (optionally inside `{...}`) -> matchers; ConfigError otherwise.

    Grammar: matcher (',' matcher)*, matcher = label op "value", op one of = != =~ !~, values in
    double quotes with \\" and \\\\ escapes. Nothing else is accepted (no metric names, no functions).
    """
    if not isinstance(text, str):
        raise ConfigError("discovery.selector: must be a string")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise ConfigError(f"discovery.selector: longer than {MAX_SELECTOR_LENGTH} characters")
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    out: list[Matcher] = []
    i, n = 0, len(s)

    def fail(why: str) -> ConfigError:
        return ConfigError(f"discovery.selector: {why} at character {i + 1} of {text!r}")

    while True:
        while i < n and s[i].isspace():
            i += 1
        if i >= n:
            break
        m = LABEL_NAME.match(s, i)
        if m is None:
            raise fail("expected a label name")
        label = m.group(0)
        i = m.end()
        while i < n and s[i].isspace():
            i += 1
        op = next((o for o in _OPS if s.startswith(o, i)), None)
        if op is None:
            raise fail("expected one of = != =~ !~")
        i += len(op)
        while i < n and s[i].isspace():
            i += 1
        if i >= n or s[i] != '"':
            raise fail('expected a "quoted" value')
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                raise fail("unterminated quoted value")
            c = s[i]
            if c == "\\":
                if i + 1 >= n or s[i + 1] not in '"\\':
                    raise fail('only \\" and \\\\ escapes are allowed')
                chars.append(s[i + 1])
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                chars.append(c)
                i += 1
        value = "".join(chars)
        if op in ("=~", "!~"):
            try:
                promregex.compile_matcher(value)
            except promregex.PromRegexError as exc:
                raise fail(f"bad regular expression {value!r}: {exc}") from None
        out.append(Matcher(label, op, value))
        while i < n and s[i].isspace():
            i += 1
        if i >= n:
            break
        if s[i] != ",":
            raise fail("expected ','")
        i += 1
    if not out:
        raise ConfigError("discovery.selector: empty; give at least one matcher such as job=\"vllm\"")
    return tuple(out)


#: the pseudo discovered label holding a target's scrape pool (its scrape config's job_name; with
#: prometheus-operator `podMonitor/<namespace>/<name>/<n>`, which only who may write that monitor sets)
SCRAPE_POOL = "__scrape_pool__"


def selects(matchers: Sequence[Matcher], labels: Mapping[str, str],
            discovered: Mapping[str, str] | None = None) -> bool:
    """All matchers hold. A matcher on a name starting with `__` reads the discovered labels (relabelling
    cannot set those; target labels never start with `__`), any other the target labels."""
    seen = discovered or {}
    return all(m.matches(seen if m.label.startswith("__") else labels) for m in matchers)
