"""The idle probe: one `max_tokens: 1` completion, recognisable by `X-LLM-Health-Probe: 1`.

Only ever sent to a backend whose last reading showed no work (the cycle decides that); the
caller counts every probe (`llm_health_probes_total{backend,result}`).
"""

from __future__ import annotations

import json
import time

from exporter.backend import HttpFailure, Target, first_model
from exporter.verdict import PROBE_ERROR, PROBE_OK, PROBE_TIMEOUT, ProbeResult

PROBE_HEADER = "X-LLM-Health-Probe"
PROBE_PROMPT = "Hi"


class Prober:
    """Probes one backend; remembers the model it found so /v1/models is asked once."""

    def __init__(self, url: str, timeout: float, model: str = "") -> None:
        self.target = Target(url, timeout)
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
            result = PROBE_TIMEOUT if exc.kind == "timeout" else PROBE_ERROR
            return ProbeResult(result, exc.detail, time.monotonic() - started)
        seconds = time.monotonic() - started
        self.target.close()  # one probe per interval at most: no idle connection (and fd) kept per backend
        if resp.status != 200:
            self.discovered = ""  # the model may have changed with a restart: ask again next time
            return ProbeResult(PROBE_ERROR, f"HTTP {resp.status}", seconds)
        try:
            data = json.loads(resp.body)
            if not data.get("choices"):
                return ProbeResult(PROBE_ERROR, "answer without choices", seconds)
        except (ValueError, AttributeError):
            return ProbeResult(PROBE_ERROR, "answer is not JSON", seconds)
        if not self.configured:
            self.discovered = model
        return ProbeResult(PROBE_OK, "", seconds)

    def close(self) -> None:
        self.target.close()
