"""`FakeVllm`: a real HTTP server on 127.0.0.1 whose page, pace and API key the test controls
(vLLM V1 page format; `/v1/*` protected by the key as vLLM's `--api-key` does, `/metrics` and
`/health` not)."""

from __future__ import annotations

import json
import threading
import time

from llm_health.httpserver import QuietHandler
from tests.support.loopback import Loopback

KEY = "s3cret-key"
KW = {"readings": 2, "interval": 0.2, "read_timeout": 0.5, "probe_timeout": 2.0}  # a fast verify()


class FakeVllm:
    """A vLLM-shaped server: /metrics (V1 page from `engines`), /health, /v1/models, /v1/completions."""

    def __init__(self, api_key: str = "") -> None:
        self.api_key = api_key
        self.engines: dict[str, dict[str, float]] = {"0": {"running": 0, "waiting": 0, "gen": 100}}
        self.lock = threading.Lock()
        self.drip = False                 # /metrics: headers at once, then the body a byte at a time...
        self.release = threading.Event()  # ...until this is set
        self.delay = 0.0                  # /metrics: seconds before the page is answered (a slow answer)
        self.hold_completions = threading.Event()  # set: /v1/completions waits until it is cleared
        self.probes = 0
        self.probes_while_busy = 0
        self.auth: dict[str, list[bool]] = {}  # path -> Authorization header present, per request
        self.metrics_done = 0
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _authorized(self) -> bool:
                path = self.path.split("?", 1)[0]
                header = self.headers.get("Authorization")
                with fake.lock:
                    fake.auth.setdefault(path, []).append(header is not None)
                if not path.startswith("/v1/") or not fake.api_key:
                    return True
                if header != f"Bearer {fake.api_key}":
                    self.reply(401, b'{"error": "Unauthorized"}', "application/json")
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._metrics()
                elif path == "/health":
                    self.reply(200, b"", "application/json")
                elif path == "/v1/models":
                    self.reply(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode(), "application/json")
                else:
                    self.reply(404, b"{}", "application/json")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if not self._authorized():
                    return
                if self.headers.get("X-LLM-Health-Probe") == "1":
                    with fake.lock:
                        fake.probes += 1
                        if fake.work() > 0:
                            fake.probes_while_busy += 1
                while fake.hold_completions.is_set():
                    time.sleep(0.01)
                self.reply(200, json.dumps({"choices": [{"text": "!"}]}).encode(), "application/json")

            def _metrics(self) -> None:
                if fake.delay:
                    time.sleep(fake.delay)    # the page is made after the wait: it shows that moment's counters
                body = fake.page().encode()
                if not fake.drip:
                    self.reply(200, body, "text/plain; version=0.0.4")
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    i = 0
                    while not fake.release.wait(0.1) and i < len(body) - 1:
                        self.wfile.write(body[i:i + 1])  # a byte now and then keeps the socket alive
                        self.wfile.flush()
                        i += 1
                    self.wfile.write(body[i:])
                    self.wfile.flush()
                with fake.lock:
                    fake.metrics_done += 1

        self.loop = Loopback(Handler)
        self.url = self.loop.url

    def set(self, engine: str, running: float = 0, waiting: float = 0, gen: float | None = None) -> None:
        with self.lock:
            e = self.engines.setdefault(engine, {"running": 0, "waiting": 0, "gen": 0})
            e.update(running=running, waiting=waiting)
            if gen is not None:
                e["gen"] = gen

    def work(self) -> float:
        return sum(e["running"] + e["waiting"] for e in self.engines.values())

    def page(self) -> str:
        with self.lock:
            engines = {k: dict(v) for k, v in self.engines.items()}
        return vllm_page(engines)

    def stop(self) -> None:
        self.release.set()
        self.hold_completions.clear()
        self.loop.stop()


def vllm_page(engines: dict[str, dict[str, float]]) -> str:
    """A vLLM V1 page: running, waiting, generation tokens per engine, and a start time."""
    lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{k}",model_name="m"}} {v["running"]}'
              for k, v in engines.items()]
    lines += ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [f'vllm:num_requests_waiting{{engine="{k}",model_name="m"}} {v["waiting"]}'
              for k, v in engines.items()]
    lines += ["# TYPE vllm:generation_tokens_total counter"]
    lines += [f'vllm:generation_tokens_total{{engine="{k}",model_name="m"}} {v["gen"]}'
              for k, v in engines.items()]
    lines += ["# TYPE process_start_time_seconds gauge", "process_start_time_seconds 1000.0", ""]
    return "\n".join(lines)
