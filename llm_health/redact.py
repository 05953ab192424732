"""Credentials in URLs (`scheme://user:password@host`) replaced by `***@` wherever a URL is shown.

One helper for every place that shows a URL or a piece of configuration: the remediator's status page
and API, the exporter's /verdicts, discovery's status, `llm-health check` / `healthcheck` output,
command-line errors, and every log line of our processes (`RedactingFormatter`, tracebacks included).
The operator's configuration keeps the credentials; only what is shown loses them.
"""

from __future__ import annotations

import logging
import re
from typing import Any, TextIO

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@")


def redact(value: Any) -> Any:
    """Credentials (user:pass@) in any URL inside `value` replaced by ***@ (strings, and the strings
    inside mappings, lists and tuples; anything else as it is)."""
    if isinstance(value, str):
        return _USERINFO.sub(r"\1***@", value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


class RedactingFormatter(logging.Formatter):
    """A log line (message, arguments and traceback) with credentials in URLs redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(fmt: str, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """logging.basicConfig with a redacting formatter (like basicConfig, nothing when the root logger
    already has handlers)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
