"""Before the kill: the diagnostics capture of a stuck backend, run right before its restart argv.

Which restarts get one (`wants_capture`, pure): a backend verified stalled (`no_progress`) or
`unresponsive` (a wedged engine whose stacks tell why), with a capture argv configured (the backend's
own `diagnostics`, else `remediator.diagnostics`); never a backend verified down (nothing left to look
at) nor a restart an operator asked for (it is not stuck). The capture is bounded by
`diagnostics_timeout` and never stops the restart (remediator/diagnostics.py); its output is stored with
the incident (`captures`) and a `diagnostics` event says how it went.
"""

from __future__ import annotations

import logging

from llm_health.config import Backend
from llm_health.exporter.observation import VerifyOutcome
from llm_health.remediator.diagnostics import PTRACE_HINT, ptrace_refused
from llm_health.remediator.restart.context import Context
from llm_health.remediator.store import CaptureResult, Incident

log = logging.getLogger("llm_health.remediator")

STUCK = (VerifyOutcome.NO_PROGRESS, VerifyOutcome.UNRESPONSIVE)


def capture_argv(ctx: Context, backend: Backend) -> tuple[str, ...]:
    return backend.diagnostics if backend.diagnostics is not None else ctx.r.diagnostics


def wants_capture(inc: Incident, argv: tuple[str, ...]) -> bool:
    return bool(argv) and not inc.requested_by and inc.verified_outcome in STUCK


def before_kill(ctx: Context, incident_id: int, backend: Backend) -> None:
    """Capture what the stuck backend shows, if it should be; never raises, never past its bound."""
    try:
        inc = ctx.store.incident(incident_id)
        argv = capture_argv(ctx, backend)
        if inc is None or not wants_capture(inc, argv):
            return
        folder = ctx.diagnostics_dir / str(incident_id) if ctx.diagnostics_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        env = {"LLM_HEALTH_BACKEND": backend.name, "LLM_HEALTH_URL": backend.url,
               "LLM_HEALTH_INCIDENT": str(incident_id), "LLM_HEALTH_DIAG_DIR": str(folder or "")}
        at = ctx.clocks.wall()
        got = ctx.io.capturer(argv, env, ctx.r.diagnostics_timeout, ctx.r.diagnostics_max_bytes)
        hint = f"; {PTRACE_HINT}" if ptrace_refused(got.output) else ""
        with ctx.store.tx() as tx:
            capture_id = tx.add_capture(incident_id, backend.name, at, " ".join(argv)[:2000], got.result,
                                        got.exit_code, got.seconds, got.output, got.truncated)
            how = {CaptureResult.OK: "captured", CaptureResult.FAILED: f"capture failed (exit {got.exit_code})",
                   CaptureResult.TIMEOUT: f"capture timed out after {ctx.r.diagnostics_timeout:g}s (kept what it "
                   "wrote)"}[got.result]
            tx.event(ctx.clocks.wall(), "diagnostics", backend.name, incident_id,
                     reason=f"before the restart: {how} in {got.seconds:.1f}s, {len(got.output)} characters{hint}",
                     capture_id=capture_id, result=got.result.value)
    except Exception:  # noqa: BLE001 - evidence is a bonus: the restart goes on without it
        log.exception("diagnostics capture of %s (incident %s) failed", backend.name, incident_id)
