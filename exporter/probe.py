"""The idle probe: one `max_tokens: 1` completion, recognisable by `X-LLM-Health-Probe: 1`.

Only ever sent to a backend whose last reading showed no work (the cycle decides that); the
caller counts every probe when sent (`llm_health_probes_sent_total{backend}`) and by result when it
finishes (`llm_health_probes_total{backend,result}`). An answer with HTTP 4xx (also from /v1/models)
is an error whose `status` marks it rejected: a misconfigured probe (API key, model), not a failed server.
"""

from __future__ import annotations

import json
import time

from llm_health.exporter.backend import HttpFailure, Target, first_model
from llm_health.exporter.observation import ProbeOutcome, ProbeResult

PROBE_HEADER = "X-LLM-Health-Probe"
PROBE_PROMPT = "Hi"


class Prober:
    """Probes one backend; remembers the model it found so /v1/models is asked once."""

    def __init__(self, url: str, timeout: float, model: str = "", api_key: str = "") -> None:
        self.target = Target(url, timeout, api_key)
        self.timeout = timeout
        self.configured = model
        self.discovered = ""

    def probe(self) -> ProbeResult:
        started = time.monotonic()
        try:
            model = self.configured or self.discovered or first_model(self.target)
            body = json.dumps({"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1,
                               "temperature": 0, "stream": False}).encode()
            resp = self.target.request(
                "POST", "/v1/completions", body=body,
                headers={"Content-Type": "application/json", PROBE_HEADER: "1"},
            )
        except HttpFailure as exc:
            self.target.close()
            result = ProbeOutcome.TIMEOUT if exc.kind == "timeout" else ProbeOutcome.ERROR
            return ProbeResult(result, exc.detail, time.monotonic() - started, exc.status)
        seconds = time.monotonic() - started
        self.target.close()  # one probe per interval at most: no idle connection (and fd) kept per backend
        if resp.status != 200:
            self.discovered = ""  # the model may have changed with a restart: ask again next time
            return ProbeResult(ProbeOutcome.ERROR, f"HTTP {resp.status}", seconds, resp.status)
        try:
            data = json.loads(resp.body)
            if not data.get("choices"):
                return ProbeResult(ProbeOutcome.ERROR, "answer without choices", seconds)
        except (ValueError, AttributeError):
            return ProbeResult(ProbeOutcome.ERROR, "answer is not JSON", seconds)
        if not self.configured:
            self.discovered = model
        return ProbeResult(ProbeOutcome.OK, "", seconds)

    def close(self) -> None:
        self.target.close()
