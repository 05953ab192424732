"""`llm-health rules render --format jsonnet`: the rules and dashboards as a monitoring mixin.

Writes DIR/mixin.libsonnet (and DIR/jsonnetfile.json for jsonnet-bundler) with the fields of the mixin
convention (kubernetes-mixin, node-mixin): `_config`, `prometheusRules` (the recording rules' groups),
`prometheusAlerts` (the alerting groups) and `grafanaDashboards` (file name -> dashboard). It is
generated from the same templates and settings as `rules render` and `dashboards render`, so with the
same settings it evaluates to exactly their output (tests/unit/llm_health/test_mixin.py runs it with the
jsonnet package).

Which settings become `_config` keys is found, not listed: each candidate (the selectors, the runbook
base, the handler regex, the durations, the integer thresholds) is rendered with two distinct marker
values, and it is a `_config` key only if the two renderings differ by the value alone, wherever it lands
(every string of the rules and dashboards). One that also feeds a computation fails that test (the stall
window, also written in seconds) and is fixed when generating, as are the settings that shape the output
(group labels, exporter, watchdog, severities, extra labels, the scrape interval from which unset windows
are derived, keep_firing_for whose 0s leaves the field out) and the fractions (jsonnet prints 0.85 as
0.84999999999999998): the file's header lists them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from llm_health.config import ConfigError
from llm_health.render import dashboards
from llm_health.render.rules import DURATION_RE, FLAG_NAMES, RATE_WINDOWS, RuleSettings, render

MIXIN_FILE = "mixin.libsonnet"
JSONNETFILE = "jsonnetfile.json"
RECORDS_FILE = "llm_health_records.yml"
INDENT = "  "
# Durations that are more than text: the scrape interval derives the rate windows; keep_firing_for 0s
# leaves the field out.
STRUCTURAL = {"scrape_interval", "keep_firing_for"}


@dataclass(frozen=True)
class Knob:
    """A setting offered as `_config.<key>`, with the two marker values that find where it lands."""

    field: str
    key: str
    a: str | int
    b: str | int


def config_key(field: str) -> str:
    name = "runbook_base_url" if field == "runbook_url" else field
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def candidates() -> list[Knob]:
    out = []
    defaults = RuleSettings()
    for i, f in enumerate(fields(RuleSettings)):
        default = getattr(defaults, f.name)
        if f.name.endswith("_selector"):
            a, b = f'llmh_marker="a{i:03d}"', f'llmh_marker="b{i:03d}"'
        elif f.name == "runbook_url":
            a, b = f"https://a{i:03d}.llmh.invalid/runbooks", f"https://b{i:03d}.llmh.invalid/runbooks"
        elif f.name == "error_rate_handlers":
            a, b = f"/llmh/a{i:03d}", f"/llmh/b{i:03d}"
        elif (f.name in RATE_WINDOWS or isinstance(default, str) and DURATION_RE.match(default)) and \
                f.name not in STRUCTURAL:
            a, b = f"{96000 + i}s", f"{98000 + i}s"
        elif type(default) is int:
            a, b = 97000 + i, 99000 + i
        else:
            continue
        out.append(Knob(f.name, config_key(f.name), a, b))
    return out


# libyaml's safe loader when PyYAML has it (the same documents, ~10 x faster: knobs_for() renders 70 times)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def rendered(settings: RuleSettings) -> dict[str, Any]:
    """The rule files and dashboards of one rendering, parsed."""
    rules = {name: yaml.load(text, Loader=_YAML_LOADER) for name, text in render(settings).items()}
    boards = {name: json.loads(text) for name, text in dashboards.render(settings).items()}
    return {"rules": rules, "dashboards": boards}


def substitute(obj: Any, pairs: list[tuple[str, str]]) -> Any:
    """`obj` with every (old, new) replaced in each string (and each int equal to old)."""
    if isinstance(obj, dict):
        return {k: substitute(v, pairs) for k, v in obj.items()}
    if isinstance(obj, list):
        return [substitute(v, pairs) for v in obj]
    if isinstance(obj, str):
        for old, new in pairs:
            obj = obj.replace(old, new)
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        for old, new in pairs:
            if str(obj) == old:
                return int(new)
    return obj


def _mentions(obj: Any, marker: str) -> bool:
    if isinstance(obj, dict):
        return any(_mentions(v, marker) for v in obj.values())
    if isinstance(obj, list):
        return any(_mentions(v, marker) for v in obj)
    return marker in obj if isinstance(obj, str) else str(obj) == marker


def _textual(settings: RuleSettings, knobs: list[Knob]) -> bool:
    """Whether rendering with the knobs' `a` markers and swapping them for the `b` markers gives the
    rendering with the `b` markers, and each marker lands somewhere."""
    try:
        with_a = rendered(replace(settings, **{k.field: k.a for k in knobs}))
        with_b = rendered(replace(settings, **{k.field: k.b for k in knobs}))
    except ConfigError:
        return False
    return (all(_mentions(with_a, str(k.a)) for k in knobs)
            and substitute(with_a, [(str(k.a), str(k.b)) for k in knobs]) == with_b)


def knobs_for(settings: RuleSettings) -> list[Knob]:
    """The candidates whose value lands in the output textually and nowhere else, with `settings`' shape
    (a set that passes together is kept; one that does not is halved, down to single candidates)."""
    def textual(knobs: list[Knob]) -> list[Knob]:
        if not knobs or _textual(settings, knobs):
            return knobs
        if len(knobs) == 1:
            return []
        half = len(knobs) // 2
        return textual(knobs[:half]) + textual(knobs[half:])
    return textual(candidates())


def _jsonnet_string(text: str, refs: dict[str, str]) -> str:
    if not refs:
        return json.dumps(text, ensure_ascii=False)
    pattern = re.compile("|".join(re.escape(m) for m in sorted(refs, key=len, reverse=True)))
    parts, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            parts.append(json.dumps(text[pos:m.start()], ensure_ascii=False))
        parts.append(refs[m.group(0)])
        pos = m.end()
    if pos < len(text) or not parts:
        parts.append(json.dumps(text[pos:], ensure_ascii=False))
    return " + ".join(parts)


def jsonnet(obj: Any, refs: dict[str, str], ints: dict[int, str], depth: int = 0) -> str:
    """`obj` as jsonnet text, each marker inside a string replaced by its `_config` reference."""
    pad, inner = INDENT * depth, INDENT * (depth + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {jsonnet(v, refs, ints, depth + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f",\n{pad}}}"
    if isinstance(obj, list):
        if not obj:
            return "[]"
        return "[\n" + ",\n".join(inner + jsonnet(v, refs, ints, depth + 1) for v in obj) + f",\n{pad}]"
    if isinstance(obj, str):
        return _jsonnet_string(obj, {m: r for m, r in refs.items() if m in obj})
    if isinstance(obj, int) and not isinstance(obj, bool) and obj in ints:
        return ints[obj]
    return json.dumps(obj)


def _value(v: str | int) -> str:
    return json.dumps(v, ensure_ascii=False)


def build(settings: RuleSettings | None = None) -> str:
    """The text of mixin.libsonnet for `settings` (ConfigError on bad settings, as `rules render`)."""
    base = settings or RuleSettings()
    values = base.validated()
    knobs = knobs_for(base)
    marked = replace(base, **{k.field: k.a for k in knobs})
    out = rendered(marked)
    if substitute(out, [(str(k.a), str(getattr(values, k.field))) for k in knobs]) != rendered(base):
        raise ConfigError("jsonnet: the settings do not combine textually (please report this)")
    refs = {str(k.a): (f"$._config.{k.key}" if isinstance(k.a, str) else f"std.toString($._config.{k.key})")
            for k in knobs}
    ints = {k.a: f"$._config.{k.key}" for k in knobs if isinstance(k.a, int)}
    rules = out["rules"]
    records = rules[RECORDS_FILE]["groups"]
    alerts = [g for name, doc in rules.items() if name != RECORDS_FILE for g in doc["groups"]]
    config = "".join(f"{INDENT * 2}{k.key}: {_value(getattr(values, k.field))},  // {_flag(k.field)}\n"
                     for k in knobs)
    exposed = {k.field for k in knobs}
    fixed = [f"{_flag(f.name).removeprefix('--')}: {_shown(getattr(values, f.name))}" for f in fields(RuleSettings)
             if f.name not in exposed]
    header = ["// Generated by `llm-health rules render --format jsonnet`: regenerate, do not edit.",
              "// The llm-health rules and dashboards as a monitoring mixin; with the same settings it evaluates",
              "// to what `llm-health rules render` and `llm-health dashboards render` write.",
              "// Fixed when generated (regenerate with other values to change them):"]
    header += [f"//   {line}" for line in fixed]
    return (
        "\n".join(header) + "\n{\n"
        f"{INDENT}_config+:: {{\n{config}{INDENT}}},\n\n"
        f"{INDENT}prometheusRules+:: {{\n{INDENT * 2}groups+: {jsonnet(records, refs, ints, 2)},\n{INDENT}}},\n\n"
        f"{INDENT}prometheusAlerts+:: {{\n{INDENT * 2}groups+: {jsonnet(alerts, refs, ints, 2)},\n{INDENT}}},\n\n"
        f"{INDENT}grafanaDashboards+:: {jsonnet(out['dashboards'], refs, ints, 1)},\n"
        "}\n"
    )


def _flag(name: str) -> str:
    return FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),))[0]


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join("=".join(v) if isinstance(v, tuple) else v for v in value) or "(none)"
    return str(value)


JSONNETFILE_TEXT = json.dumps({"version": 1, "dependencies": [], "legacyImports": True}, indent=2) + "\n"


def write(out_dir: Path, settings: RuleSettings | None = None) -> list[Path]:
    """Render first, then write both files; a failure leaves `out_dir` untouched."""
    text = build(settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in ((MIXIN_FILE, text), (JSONNETFILE, JSONNETFILE_TEXT)):
        target = out_dir / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(content, encoding="utf-8")
        tmp.replace(target)
        written.append(target)
    return written
