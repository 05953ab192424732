"""Every shipped HAProxy config sheds load explicitly and sends requests without affinity to the least-loaded
server, with limits sized from its engines' slot count (docs/load-balancing.md, "Slots, queue and 503").

Static checks of the files; tests/e2e/test_haproxy_shedding.py runs the same directives in a real HAProxy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.deploy.test_haproxy_check import SHIPPED, seconds
from tests.support.haproxy import (
    LEAST_LOADED_LUA,
    Sizing,
    backend_directives,
    section_setting,
    server_limits,
    use_server_lines,
)
from tests.support.paths import REPO

ids = [str(p.relative_to(REPO)) for p in SHIPPED]


def engine_slots(text: str) -> int:
    """The slot count a config says it was sized for: its comment `engine slots: N` (any case)."""
    found = {int(m) for m in re.findall(r"engine slots: (\d+)", text, re.I)}
    assert len(found) == 1, f"one `engine slots: N` comment expected, found {found}"
    return found.pop()


def servers(text: str, section: str = "backend vllm") -> list[tuple[str, str]]:
    """(name, address) of the section's server lines."""
    found, inside = [], False
    for raw in text.splitlines():
        if raw and not raw[0].isspace():
            inside = raw.strip() == section
        elif inside and raw.split()[:1] == ["server"]:
            found.append((raw.split()[1], raw.split()[2]))
    return found


@pytest.mark.parametrize("path", SHIPPED, ids=ids)
def test_limits_follow_the_sizing_rule(path: Path) -> None:
    text = path.read_text()
    size = Sizing(engine_slots(text))
    assert server_limits(text) == {"maxconn": size.maxconn, "maxqueue": size.maxqueue}
    deny = [line for line in backend_directives(text) if line.startswith("http-request deny")]
    assert deny == ["http-request deny deny_status 503 if !{ req.hdr(X-Session-Id) -m found } "
                    f"!{{ var(txn.least_loaded) -m found }} {{ avg_queue gt {size.maxqueue} }}"]


def test_the_rule() -> None:
    """Slots plus an eighth (at least 2) in flight; a quarter of the slots (at least 2) waiting."""
    assert [(Sizing(s).maxconn, Sizing(s).maxqueue) for s in (1, 2, 4, 12, 64, 256)] == [
        (3, 2), (4, 2), (6, 2), (14, 3), (72, 16), (288, 64)]


@pytest.mark.parametrize("path", SHIPPED, ids=ids)
def test_queue_time_is_bounded(path: Path) -> None:
    value = section_setting(path.read_text(), "defaults", "timeout", "queue")
    assert value is not None and 10 <= seconds(value) <= 30, value


@pytest.mark.parametrize("path", SHIPPED, ids=ids)
def test_every_503_carries_retry_after_and_an_openai_style_json_error(path: Path) -> None:
    (line,) = [line for line in backend_directives(path.read_text()) if line.startswith("http-error ")]
    match = re.fullmatch(r"http-error status 503 content-type application/json hdr Retry-After (\d+) string '(.*)'",
                         line)
    assert match, line
    assert int(match.group(1)) > 0
    body = json.loads(match.group(2))
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", SHIPPED, ids=ids)
def test_requests_without_a_session_take_the_least_loaded_path(path: Path) -> None:
    text = path.read_text()
    globals_ = backend_directives(text, "global")
    assert "default-path config" in [line.split("#")[0].strip() for line in globals_]
    assert f"lua-load-per-thread {LEAST_LOADED_LUA.name}" in globals_
    directives = backend_directives(text)
    assert "http-request lua.least_loaded if !{ req.hdr(X-Session-Id) -m found }" in directives
    names = [name for name, _ in servers(text)]
    assert [line for line in directives if line.startswith("use-server ")] == use_server_lines(names)
    assert "balance hdr(X-Session-Id)" in directives and "hash-balance-factor 150" in directives


@pytest.mark.parametrize("path", SHIPPED, ids=ids)
def test_requests_that_generate_nothing_take_no_slot(path: Path) -> None:
    """GET /v1/models (the exporter's proxy check) must not wait for a generation slot or get the 503: the
    frontend sends everything but POST to vllm-meta, the same servers tracking vllm's, without maxconn."""
    text = path.read_text()
    assert [line.split("#")[0].strip() for line in backend_directives(text, "frontend llm")[1:]] == [
        "use_backend vllm-meta unless METH_POST", "default_backend vllm"]
    meta = servers(text, "backend vllm-meta")
    assert meta == servers(text)
    for name, _ in meta:
        (line,) = [raw for raw in text.splitlines() if raw.split()[:2] == ["server", name] and "track" in raw]
        assert line.split()[3:5] == ["track", f"vllm/{name}"] and "maxconn" not in line
    assert server_limits(text, "backend vllm-meta") == {}
