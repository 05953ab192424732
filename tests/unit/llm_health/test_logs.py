"""llm_health/logs.py: three formats through one handler, every one redacted; scrapes' access lines dropped."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from llm_health import logs
from llm_health.logs import LogFormat, LogLevel, QuietScrapes
from tests.support import logfmt

SECRET = "hunter2-s3cret"
URL = f"http://admin:{SECRET}@127.0.0.1:9/x"


@pytest.fixture
def root() -> Iterator[None]:
    """The root logger as it was, afterwards."""
    r = logging.getLogger()
    saved, level = r.handlers[:], r.level
    yield
    r.handlers, r.level = saved, level
    logs._installed = None


def emit(fmt: LogFormat, with_pid: bool = False) -> list[str]:
    out = io.StringIO()
    logs.setup(fmt, LogLevel.INFO, stream=out, with_pid=with_pid)
    log = logging.getLogger("llm_health.test")
    log.info("backend %s: idle -> down: %s", "gpu-a", f"cannot reach {URL}", extra={"backend": "gpu-a", "n": 3})
    try:
        raise OSError(f"refused by {URL}")
    except OSError:
        log.exception("read failed\nsecond line")
    return out.getvalue().splitlines()


def test_json_lines_parse_and_are_redacted(root: None) -> None:
    lines = emit(LogFormat.JSON, with_pid=True)
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "info" and first["logger"] == "llm_health.test"
    assert first["msg"] == "backend gpu-a: idle -> down: cannot reach http://***@127.0.0.1:9/x"
    assert first["backend"] == "gpu-a" and first["n"] == 3 and isinstance(first["pid"], int)
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert second["level"] == "error" and "OSError: refused by http://***@127.0.0.1:9/x" in second["exc"]
    assert SECRET not in "\n".join(lines)


def test_logfmt_lines_parse_and_a_traceback_stays_on_its_line(root: None) -> None:
    lines = emit(LogFormat.LOGFMT)
    assert len(lines) == 2, lines
    first, second = (logfmt.parse(line) for line in lines)
    assert first["msg"] == "backend gpu-a: idle -> down: cannot reach http://***@127.0.0.1:9/x"
    assert first["level"] == "info" and first["backend"] == "gpu-a" and first["n"] == "3"
    assert second["msg"] == "read failed\nsecond line"
    assert second["exc"].startswith("Traceback") and "OSError: refused by http://***@127.0.0.1:9/x" in second["exc"]
    assert SECRET not in "\n".join(lines)


def test_text_is_the_old_format_redacted(root: None) -> None:
    text = "\n".join(emit(LogFormat.TEXT))
    assert " INFO backend gpu-a: idle -> down: cannot reach http://***@127.0.0.1:9/x" in text
    assert "OSError: refused by http://***@127.0.0.1:9/x" in text and SECRET not in text


def test_setup_again_replaces_only_its_own_handler(root: None) -> None:
    other = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    logs.setup(LogFormat.TEXT, stream=first)
    logs.setup(LogFormat.JSON, stream=second)
    logging.getLogger("llm_health.test").warning("once")
    assert first.getvalue() == "" and json.loads(second.getvalue())["msg"] == "once"
    assert other in logging.getLogger().handlers


def gunicorn_access(path: str) -> logging.LogRecord:
    atoms = {"h": "127.0.0.1", "m": "GET", "U": path, "s": "200", "L": "0.001200", "r": f"GET {path} HTTP/1.1"}
    return logging.LogRecord(logs.ACCESS_LOGGER, logging.INFO, "glogging.py", 1, '%(h)s "%(r)s" %(s)s', (atoms,), None)


def test_quiet_scrapes_drops_scrapes_and_health_checks_only(root: None) -> None:
    logs.setup(LogFormat.TEXT, LogLevel.INFO, stream=io.StringIO())
    quiet = QuietScrapes()
    for path in ("/metrics", "/healthz", "/health", "/api/backends/vllm-0/readiness"):
        assert not quiet.filter(gunicorn_access(path)), path
    assert quiet.filter(gunicorn_access("/webhook")) and quiet.filter(gunicorn_access("/"))
    assert quiet.filter(gunicorn_access("/api/backends")) and quiet.filter(gunicorn_access("/api/backends/x/drain"))
    own = logging.LogRecord("x", logging.INFO, "x", 1, "GET /metrics?x=1", (), None)
    own.path = "/metrics?x=1"
    assert not quiet.filter(own)
    assert quiet.filter(logging.LogRecord("x", logging.INFO, "x", 1, "scraped /metrics", (), None))  # not access
    logs.setup(LogFormat.TEXT, LogLevel.DEBUG, stream=io.StringIO())
    assert quiet.filter(gunicorn_access("/metrics"))        # debug: everything


def test_gunicorn_access_records_get_fields(root: None) -> None:
    record = gunicorn_access("/webhook")
    fields = json.loads(logs.JsonFormatter().format(record))
    assert fields["msg"] == '127.0.0.1 "GET /webhook HTTP/1.1" 200'
    assert (fields["method"], fields["path"], fields["status"], fields["duration_seconds"]) == \
        ("GET", "/webhook", 200, 0.0012)


def test_bad_format_and_level_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="text, logfmt, json"):
        logs.parse_format("yaml")
    with pytest.raises(ValueError, match="debug, info, warning, error"):
        logs.parse_level("loud")
    assert logs.parse_level("WARNING") is LogLevel.WARNING
