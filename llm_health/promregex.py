"""Prometheus' regular expressions: RE2 syntax, matched against the whole value, `.` matching newlines.

Prometheus parses a matcher's value with Go's RE2 parser (Perl flags, DotNL) and matches it as
`^(?s:VALUE)$` (model/labels/regexp.go). Python's `re` is another dialect, so a selector checked and
matched with it can mean two things:
- `re` accepts what RE2 refuses: backreferences (`(a)\\1`), look-around (`(?=`, `(?!`, `(?<=`), atomic
  groups (`(?>`), possessive quantifiers (`a*+`), `\\Z`; Prometheus would not load such a selector;
- `re`'s `\\d`, `\\w`, `\\s` match any Unicode digit, letter or space, RE2's ASCII ones only;
- `re`'s `.` matches no newline, Prometheus' does.
Here a value is compiled with RE2 itself (google-re2: the C++ RE2 library, whose syntax Go's regexp
follows; rare corner cases aside they accept the same patterns), first alone (so `a)|(b` cannot escape
the anchors) and then anchored as Prometheus anchors it. A pattern RE2 refuses is a clear ValueError.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

MAX_MEMORY = 8 << 20   # RE2's own default; a pattern whose program needs more is refused, never slow


class PromRegexError(ValueError):
    """The pattern is not a regular expression Prometheus accepts."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False      # RE2 would print each refusal to stderr; the error says it instead
    options.max_mem = MAX_MEMORY
    return options


def _compile(pattern: str) -> Any:
    try:
        return re2.compile(pattern, options=_options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise PromRegexError(f"{reason} (Prometheus uses RE2: no backreferences, look-around, atomic groups "
                             "or possessive quantifiers)") from None


@functools.lru_cache(maxsize=4096)
def compile_matcher(value: str) -> Any:
    """The compiled `^(?s:value)$`; PromRegexError when RE2 refuses `value`."""
    _compile(value)                           # alone first: a value cannot close the group it is put in
    return _compile(f"^(?s:{value})$")


def matches(value: str, text: str) -> bool:
    """Whether the label value `text` matches the regex matcher value `value`, as in Prometheus."""
    return compile_matcher(value).search(text) is not None
