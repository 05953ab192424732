"""Both /metrics (a real exporter and a real remediator) through prometheus_client's exposition: the text
format by default, OpenMetrics when asked, gzip when asked, HEAD answered; llm_health_build_info = 1;
`promtool check metrics` clean."""

from __future__ import annotations

import gzip
import http.client
import shutil
import subprocess
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
import requests
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from llm_health import __version__
from llm_health.drill.procs import ManagedProcess, free_port, llm_health
from tests.support.remediator_process import Remediator

OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def exporter_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = ManagedProcess(llm_health("exporter", "--listen", f"127.0.0.1:{port}", "--interval", 0.3,
                                     "--read-timeout", 0.5, "--backend", f"gpu-a=http://127.0.0.1:{free_port()}"),
                          "exporter", tmp_path_factory.mktemp("exporter"))
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def remediator_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    r = Remediator(tmp_path_factory.mktemp("remediator"),
                   {"backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}", "restart": ["true"]}]})
    try:
        yield r.wait_ready().url
    finally:
        r.stop()


@pytest.fixture(params=["exporter", "remediator"])
def metrics_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param}_url") + "/metrics"


def test_text_format_by_default_with_build_info(metrics_url: str) -> None:
    r = requests.get(metrics_url, headers={"Accept-Encoding": "identity"}, timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in r.headers and r.headers["Vary"] == "Accept, Accept-Encoding"
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    (sample,) = families["llm_health_build_info"].samples
    assert sample.value == 1 and sample.labels["version"] == __version__
    assert set(sample.labels) == {"version", "revision", "python"}


def test_openmetrics_when_asked(metrics_url: str) -> None:
    r = requests.get(metrics_url, headers={"Accept": OPENMETRICS, "Accept-Encoding": "identity"}, timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert r.text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(r.text)}       # the strict OpenMetrics parser
    assert families["llm_health_build"].type == "info"
    assert any(f.type == "counter" and f.name.startswith("llm_health_") for f in families.values())


def test_gzip_when_asked(metrics_url: str) -> None:
    r = requests.get(metrics_url, headers={"Accept-Encoding": "gzip"}, timeout=5, stream=True)
    raw = r.raw.read(decode_content=False)
    assert r.headers["Content-Encoding"] == "gzip" and int(r.headers["Content-Length"]) == len(raw)
    text = gzip.decompress(raw).decode()
    assert "llm_health_build_info{" in text


def test_head_answers_the_headers_without_a_body(metrics_url: str) -> None:
    url = urlparse(metrics_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    try:
        conn.request("HEAD", url.path, headers={"Accept-Encoding": "identity"})
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        assert head.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
        assert int(head.getheader("Content-Length") or 0) > 0
        conn.request("GET", url.path, headers={"Accept-Encoding": "identity"})   # same connection: no stray body
        get = conn.getresponse()
        assert get.status == 200 and b"llm_health_build_info" in get.read()
    finally:
        conn.close()


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")
def test_promtool_check_metrics_is_clean(metrics_url: str) -> None:
    text = requests.get(metrics_url, timeout=5).text
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
