"""Our processes' log lines: one handler on the root logger, in one of three formats, always redacted.

    text     2026-12-01 10:00:00,123 INFO backend gpu-a: busy -> stalled: ...        (the default, as before)
    logfmt   time=2026-12-01T10:00:00.123Z level=info logger=llm_health.exporter msg="backend gpu-a: ..."
    json     {"time": "2026-12-01T10:00:00.123Z", "level": "info", "logger": "llm_health.exporter", "msg": "..."}

logfmt and json follow the Prometheus ecosystem's exporters (`--log.format logfmt|json`): one line per
record, UTC RFC 3339 times with milliseconds, a lower-case level, the message under `msg`; a traceback
goes in `exc` (logfmt escapes its newlines, so a record stays one line), and the fields a caller passes
with `extra={...}` follow as keys of their own (`backend=gpu-a`). gunicorn's access records (the
remediator) also carry `remote`, `method`, `path`, `status` and `duration_seconds`. Every format redacts
credentials in URLs (llm_health.redact) in the message, its arguments, the traceback and every field.

Access lines of scrapes and health checks (`/metrics`, `/health`, `/healthz`, and the readiness sidecars'
`/api/backends/<name>/readiness`, one per vLLM pod) are noise at a scrape every few seconds: `QuietScrapes` is a logging filter that drops them (an access record names its path in
`extra={"path": ...}`, or, from gunicorn's access logger, in the `U` atom of its arguments) unless the
level is debug.

`setup()` may be called again: it replaces the handler it installed before and leaves any other alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, TextIO

from llm_health.redact import RedactingFormatter, redact

TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
SCRAPE_PATHS = frozenset({"/metrics", "/health", "/healthz"})
#: what every vLLM pod's readiness sidecar polls every few seconds (remediator/sidecar/)
POLLED_PATH = re.compile(r"^/api/backends/[^/]+/readiness$")
ACCESS_LOGGER = "gunicorn.access"


class LogFormat(StrEnum):
    TEXT = "text"
    LOGFMT = "logfmt"
    JSON = "json"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def number(self) -> int:
        return int(logging.getLevelName(self.value.upper()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--log-format and --log-level, the same on every long-running command."""
    parser.add_argument("--log-format", type=_argument(parse_format), default=LogFormat.TEXT,
                        metavar="|".join(LogFormat),
                        help="log line format (default text; logfmt and json: one record per line)")
    parser.add_argument("--log-level", type=_argument(parse_level), default=LogLevel.INFO, metavar="|".join(LogLevel),
                        help="least severe level logged (default info; debug also logs scrapes' access lines)")


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def parse_format(value: str) -> LogFormat:
    """ValueError naming the choices for anything but text, logfmt, json."""
    try:
        return LogFormat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a log format (one of {', '.join(LogFormat)})") from None


def parse_level(value: str) -> LogLevel:
    try:
        return LogLevel(value.lower())
    except ValueError:
        raise ValueError(f"{value!r} is not a log level (one of {', '.join(LogLevel)})") from None


# attributes every LogRecord has: anything else on a record came in through `extra=`
_STANDARD = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "", (), None))) | {"message", "asctime"}
# gunicorn access atoms shown as fields of their own: (field, atom)
_ACCESS_ATOMS = (("remote", "h"), ("method", "m"), ("path", "U"), ("status", "s"), ("duration_seconds", "L"))


def _utc(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def _scalar(value: Any) -> Any:
    return value if isinstance(value, bool | int | float) or value is None else str(value)


class _Structured(logging.Formatter):
    """The fields of one record, redacted: time, level, logger, (pid), msg, the extras, exc."""

    def __init__(self, with_pid: bool = False) -> None:
        super().__init__()
        self.with_pid = with_pid

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        out: dict[str, Any] = {"time": _utc(record.created), "level": record.levelname.lower(),
                               "logger": record.name}
        if self.with_pid:
            out["pid"] = record.process
        out["msg"] = record.getMessage()
        if record.name == ACCESS_LOGGER and isinstance(record.args, Mapping):
            for key, atom in _ACCESS_ATOMS:
                value = record.args.get(atom)
                if value is not None and value != "-":
                    out[key] = _number(value) if key in ("status", "duration_seconds") else str(value)
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = _scalar(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return {k: redact(v) for k, v in out.items()}


def _number(value: Any) -> Any:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return int(number) if number.is_integer() and "." not in str(value) else number


def _logfmt_value(value: Any) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") \
        .replace("\t", "\\t")
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


def _logfmt_key(key: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "_" for c in key)
    return cleaned or "_"


class LogfmtFormatter(_Structured):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{_logfmt_key(k)}={_logfmt_value(v)}" for k, v in self.fields(record).items())


class JsonFormatter(_Structured):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record), ensure_ascii=False, default=str)


def formatter(fmt: LogFormat, text_format: str = TEXT_FORMAT, with_pid: bool = False) -> logging.Formatter:
    if fmt == LogFormat.LOGFMT:
        return LogfmtFormatter(with_pid)
    if fmt == LogFormat.JSON:
        return JsonFormatter(with_pid)
    return RedactingFormatter(text_format)


class QuietScrapes(logging.Filter):
    """Drops access records of scrapes and health checks (paths in `paths`), except at debug level."""

    def __init__(self, paths: frozenset[str] = SCRAPE_PATHS) -> None:
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            return True
        path = access_path(record)
        return path not in self.paths and not (path is not None and POLLED_PATH.match(path))


def access_path(record: logging.LogRecord) -> str | None:
    """The request path of an access record: `extra={"path": ...}`, or gunicorn's `U` atom."""
    path = getattr(record, "path", None)
    if isinstance(path, str):
        return path.split("?", 1)[0]
    if record.name == ACCESS_LOGGER and isinstance(record.args, Mapping):
        atom = record.args.get("U")
        if isinstance(atom, str):
            return atom
    return None


_installed: logging.Handler | None = None
_lock = threading.Lock()


def setup(fmt: LogFormat = LogFormat.TEXT, level: LogLevel = LogLevel.INFO, stream: TextIO | None = None,
          text_format: str = TEXT_FORMAT, with_pid: bool = False) -> logging.Handler:
    """Our one handler on the root logger, in `fmt` at `level` (again: replaces the one set up before).
    Warnings and uncaught exceptions in threads go through it too, so a JSON log stays JSON."""
    global _installed
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt, text_format, with_pid))
    handler.setLevel(level.number)         # also for records propagated from loggers with their own level
    root = logging.getLogger()
    with _lock:
        if _installed is not None:
            root.removeHandler(_installed)
        root.addHandler(handler)
        root.setLevel(level.number)
        _installed = handler
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    return handler


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("llm_health").error("uncaught exception in thread %s", name,
                                          exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
