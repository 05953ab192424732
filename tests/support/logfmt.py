"""A strict logfmt reader for the tests: `key=value key="quoted \\"value\\""` -> dict, or ValueError.

Strict on purpose: a line our formatter writes must parse whole (no stray text, no unterminated quote,
no key twice), the way go-logfmt reads it.
"""

from __future__ import annotations

import re

_PAIR = re.compile(r'([^\s="]+)=(?:"((?:[^"\\]|\\.)*)"|([^\s"]*))(?:\s+|$)')
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            out.append(chr(int(text[i + 2:i + 6], 16)))
            i += 6
        else:
            out.append(_ESCAPES[nxt])
            i += 2
    return "".join(out)


def parse(line: str) -> dict[str, str]:
    pos = 0
    out: dict[str, str] = {}
    line = line.rstrip("\n")
    while pos < len(line):
        m = _PAIR.match(line, pos)
        if m is None:
            raise ValueError(f"not logfmt at {pos}: {line[pos:pos + 40]!r} in {line!r}")
        key = m.group(1)
        if key in out:
            raise ValueError(f"key {key!r} twice in {line!r}")
        out[key] = _unescape(m.group(2)) if m.group(2) is not None else m.group(3)
        pos = m.end()
    if not out:
        raise ValueError(f"empty logfmt line {line!r}")
    return out
