"""`--settings FILE`: the rule settings written once, for every render.

The rules, the PrometheusRule, the dashboards (JSON or ConfigMaps) and the mixin are rendered by separate
commands that must agree (selectors, group labels, the runbook base URL). A YAML file holds those
settings once; each render reads it with `--settings FILE`, and a flag given on the command line wins
over the file. Keys are the flags' names without the dashes (`runbook-base-url`, `group-labels`,
`vllm-selector`; underscores work too):

    runbook-base-url: https://llm-health.example.com/runbooks
    group-labels: [cluster, namespace]
    vllm-selector: 'job="vllm"'
    severity: {LLMTooFewBackendsUp: page}
    extra-label: {team: ml-platform}

An unknown key or a value of the wrong type is a ConfigError naming the file and the key; the values
are then validated as the flags' are (RuleSettings.validated).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from llm_health.config import ConfigError


def _names() -> dict[str, str]:
    """Every accepted key -> the RuleSettings field."""
    from llm_health.render.rules import FLAG_NAMES, RuleSettings

    out: dict[str, str] = {}
    for f in fields(RuleSettings):
        for name in (f.name, *(flag.lstrip("-") for flag in FLAG_NAMES.get(f.name, ()))):
            out[name.replace("_", "-")] = f.name
            out[name.replace("-", "_")] = f.name
    out["without-exporter"] = out["without_exporter"] = "!exporter"
    return out


def _pairs(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        items = [tuple(v.split("=", 1)) for v in value]
    else:
        raise ConfigError(f"{where}: must be a mapping (KEY: VALUE) or a list of KEY=VALUE")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items):
        raise ConfigError(f"{where}: keys and values must be strings")
    return tuple((k, v) for k, v in items)


def _value(field: str, default: Any, value: Any, where: str) -> Any:
    if field == "group_labels":
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{where}: must be a list of label names")
    if field in ("severity", "extra_labels"):
        return _pairs(value, where)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: must be a number")
        return float(value)
    if not isinstance(value, str):   # str, or a window left unset (None)
        raise ConfigError(f"{where}: must be a string (quote durations and selectors)")
    return value


def load(path: Path) -> dict[str, Any]:
    """The RuleSettings changes FILE holds; ConfigError on an unreadable file, unknown key or bad type."""
    from llm_health.render.rules import RuleSettings

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"--settings {path}: cannot be read ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--settings {path}: must be a mapping of settings")
    names, defaults = _names(), RuleSettings()
    changes: dict[str, Any] = {}
    for key, value in data.items():
        field = names.get(str(key))
        if field is None:
            known = ", ".join(sorted({k for k in names if "_" not in k}))
            raise ConfigError(f"--settings {path}: unknown setting {key!r} (known: {known})")
        where = f"--settings {path}: {key}"
        if field == "!exporter":
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: must be true or false")
            field, value = "exporter", not value
        else:
            value = _value(field, getattr(defaults, field), value, where)
        if field in changes:
            raise ConfigError(f"--settings {path}: {key} given twice")
        changes[field] = value
    return changes
