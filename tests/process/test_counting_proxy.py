"""The real-engine tests' counting proxy (tests/support/counting_proxy.py): it answers the exporter while
the test process is not scheduled, and counts probes against the test's spans of work in flight.

CI once saw a real vLLM judged stalled under load because the proxy, then a thread of the test process,
answered nothing for 17 s while no thread of the test process ran: the exporter saw a server with work
that answered nothing. Here the test process stops itself (SIGSTOP, continued by a helper) while another
process reads through the proxy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llm_health.drill.procs import ManagedProcess, free_port
from tests.support.real_engines import CountingProxy, get, wait_for

PAGE = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"

# Reads /metrics through the proxy every 0.2 s for `seconds` (each read bounded by 1 s), then sends one
# probe; prints {"answered": n, "failed": [seconds since start of each failure]}.
READER = """
import http.client, json, sys, time
url, seconds = sys.argv[1], float(sys.argv[2])
host, port = url.removeprefix("http://").split(":")
start, answered, failed = time.monotonic(), 0, []
while time.monotonic() - start < seconds:
    conn = http.client.HTTPConnection(host, int(port), timeout=1.0)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        resp.read()
        answered += resp.status == 200
    except OSError:
        failed.append(round(time.monotonic() - start, 1))
    finally:
        conn.close()
    time.sleep(0.2)
conn = http.client.HTTPConnection(host, int(port), timeout=5.0)
conn.request("POST", "/v1/completions", body=b"{}", headers={"X-LLM-Health-Probe": "1"})
conn.getresponse().read()
print(json.dumps({"answered": answered, "failed": failed}))
"""


def backend(tmp_path: Path) -> tuple[ManagedProcess, str]:
    """A /metrics page served by a process of its own (python -m http.server)."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "metrics").write_text(PAGE)
    port = free_port()
    proc = ManagedProcess([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], "backend",
                          tmp_path, cwd=tmp_path / "www")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: get(url, "/metrics", 1.0)[0] == 200, 30, "backend answers")
    return proc, url


def test_the_proxy_answers_while_the_test_process_is_stopped(tmp_path: Path) -> None:
    server, url = backend(tmp_path)
    spans: list[tuple[float, float | None]] = []
    proxy = CountingProxy(url, tmp_path, busy_spans=lambda: spans)
    try:
        reader = subprocess.Popen([sys.executable, "-c", READER, proxy.url, "6"], stdout=subprocess.PIPE,
                                  text=True)
        wait_for(lambda: len(proxy.pages) >= 2, 30, "the reader reads through the proxy")
        # no thread of this process runs for 2 s (a helper continues it)
        subprocess.Popen(["sh", "-c", f"sleep 2; kill -CONT {os.getpid()}"])
        stopped = time.monotonic()
        os.kill(os.getpid(), signal.SIGSTOP)
        resumed = time.monotonic()
        out, _ = reader.communicate(timeout=60)
        seen = json.loads(out)
        assert resumed - stopped >= 1.5, "the test process was not stopped"
        assert seen["failed"] == [] and seen["answered"] >= 5, seen
        # the pages read while this process was stopped went through the proxy
        assert any(stopped < started < resumed for started, _, _ in proxy.pages), proxy.pages
        assert proxy.probes == 1 and proxy.probes_while_busy == 0
        # the probe arrived after the reads: a span still open then counts it as sent while busy
        spans.append((stopped, None))
        assert proxy.probes_while_busy == 1
        at, pages = proxy.busy_probe_pages[0]
        assert at > stopped and pages and all(page == PAGE for page in pages)
        spans[0] = (stopped, stopped + 0.1)
        assert proxy.probes_while_busy == 0
    finally:
        proxy.stop()
        server.stop()
