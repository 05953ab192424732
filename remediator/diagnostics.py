"""Diagnostics before a kill: run the configured capture argv right before the restart of a stuck backend.

A restart destroys the evidence (the engine's thread stacks, its last pages), so before the restart argv of
a backend verified stalled (`no_progress`) or `unresponsive` runs, the authority runs the capture argv
(`remediator.diagnostics`, or the backend's own `diagnostics`; no shell) and stores its output with the
incident (size-capped). The default recipe is `llm-health diagnose` (remediator/diagnose.py: /health,
two /metrics pages, `py-spy dump` of the engine's processes, a log tail).

Bounded: the capture gets `diagnostics_timeout` seconds in all; then its whole process group is killed and
what it wrote so far is kept, marked timed out. A capture never delays the restart past that bound, and
a capture that fails (cannot start, exits non-zero, times out) never stops the restart.

The child gets LLM_HEALTH_BACKEND, LLM_HEALTH_URL, LLM_HEALTH_INCIDENT and LLM_HEALTH_DIAG_DIR (a folder
for files it wants to keep, beside the state) in its environment, never anything from an alert.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_health.remediator.action import kill_group
from llm_health.remediator.store.rows import CaptureResult

READ_CHUNK = 65536
PTRACE_HINT = ("py-spy needs SYS_PTRACE: systemd: AmbientCapabilities=CAP_SYS_PTRACE in the unit that runs the "
               "capture (and the engine's user, or root); Kubernetes: securityContext.capabilities.add: [SYS_PTRACE] "
               "and shareProcessNamespace: true in the vLLM pod (docs/operations.md)")
_REFUSED = ("Permission denied", "Operation not permitted", "EPERM", "SYS_PTRACE")


def ptrace_refused(text: str) -> bool:
    """The output says a tracer (py-spy) was refused the right to trace: PTRACE_HINT says how to grant it."""
    return any(word in text for word in _REFUSED)


@dataclass(frozen=True)
class Capture:
    result: CaptureResult
    exit_code: int | None
    output: str
    seconds: float
    truncated: bool = False


def capture(argv: Sequence[str], env: Mapping[str, str], timeout: float, max_bytes: int) -> Capture:
    """Run `argv` (stdout and stderr together) for at most `timeout` seconds; keep at most `max_bytes`."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True)
    except OSError as exc:
        return Capture(CaptureResult.FAILED, None, f"could not start {argv[0]!r}: {exc.strerror or exc}",
                       time.monotonic() - started)
    kept = bytearray()
    dropped = False

    def read() -> None:
        nonlocal dropped
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(READ_CHUNK):      # type: ignore[attr-defined]
            room = max_bytes - len(kept)
            if room > 0:
                kept.extend(chunk[:room])
            if len(chunk) > room:
                dropped = True

    reader = threading.Thread(target=read, name="diagnostics-reader", daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc.pid)
        proc.wait()
    # a child the capture left behind may hold the pipe: never wait on it past the bound
    reader.join(timeout=max(0.0, started + timeout - time.monotonic()) + 0.5)
    if timed_out:
        kind = CaptureResult.TIMEOUT
    else:
        kind = CaptureResult.OK if proc.returncode == 0 else CaptureResult.FAILED
    text = bytes(kept).decode("utf-8", errors="replace")
    if timed_out:
        text += f"\n[llm-health: capture killed after {timeout:g}s (diagnostics_timeout); kept what it wrote]"
    if dropped:
        text += f"\n[llm-health: output cut at {max_bytes} bytes (diagnostics_max_bytes)]"
    return Capture(kind, None if timed_out else proc.returncode, text, time.monotonic() - started, dropped)
