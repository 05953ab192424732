"""Restart argv templates: `{label}` placeholders filled only with DNS-1123 names; never a shell."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from llm_health.config import ConfigError

#: DNS-1123 subdomain (Kubernetes pod and node names): lower-case labels of [a-z0-9-], dot-separated
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS1123_MAX = 253
_PLACEHOLDER = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")


class PlaceholderError(ValueError):
    """A placeholder could not be filled safely; the message says which and why."""


def dns1123(value: str) -> bool:
    """True for a DNS-1123 subdomain: 1-253 characters, dot-separated labels of 1-63 [a-z0-9-], each
    starting and ending with a letter or digit. No spaces, shell characters, slashes, `..` or non-ASCII."""
    if not isinstance(value, str) or not 0 < len(value) <= DNS1123_MAX or not value.isascii():
        return False
    return all(DNS1123_LABEL.fullmatch(part) is not None for part in value.split("."))


def template_placeholders(argv: Sequence[str], where: str = "discovery.restart") -> tuple[str, ...]:
    """The placeholder names used in an argv template; ConfigError for any other brace.

    `{name}` is a placeholder, `{{` and `}}` are literal braces; nothing else (no format specs,
    no attribute access: this is not str.format)."""
    names: list[str] = []
    for k, arg in enumerate(argv):
        if not isinstance(arg, str) or not arg:
            raise ConfigError(f"{where}[{k}]: must be a non-empty string")
        rest = arg.replace("{{", "").replace("}}", "")
        for m in _PLACEHOLDER.finditer(rest):
            names.append(m.group(1))
        if "{" in _PLACEHOLDER.sub("", rest) or "}" in _PLACEHOLDER.sub("", rest):
            raise ConfigError(f"{where}[{k}]: {arg!r}: braces must be {{label}} placeholders (or {{{{ }}}})")
    return tuple(dict.fromkeys(names))


def expand_argv(argv: Sequence[str], values: Mapping[str, str],
                sources: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Fill `{name}` placeholders from `values`. Every value used must be a DNS-1123 name, otherwise
    PlaceholderError (the caller then does not restart). The result is argv: it never meets a shell.
    `sources` (placeholder -> the label it is read from) only makes the errors say where."""
    where = sources or {}

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        source = where.get(name, name)
        if name not in values:
            raise PlaceholderError(f"placeholder {{{name}}}: the target has no label {source!r}")
        value = values[name]
        if not dns1123(value):
            shown = value if len(value) <= 80 else value[:80] + "..."
            raise PlaceholderError(f"placeholder {{{name}}}: label {source} value {shown!r} is not a DNS-1123 "
                                   f"name (lower-case a-z, 0-9, '-', '.', at most {DNS1123_MAX} characters)")
        return value

    out: list[str] = []
    for arg in argv:
        parts = re.split(r"(\{\{|\}\})", arg)
        filled = "".join({"{{": "{", "}}": "}"}.get(p) or _PLACEHOLDER.sub(fill, p) for p in parts)
        out.append(filled)
    return tuple(out)
