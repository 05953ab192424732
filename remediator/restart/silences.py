"""Alertmanager silences around one restart: created when the drain (or the claim) begins, expired when the
restart is over. Every failure is recorded and never holds the restart back (a silence ends by itself)."""

from __future__ import annotations

import logging

from llm_health.config import Backend
from llm_health.remediator.restart.context import Context
from llm_health.remediator.silence import SilenceError, create_silence, expire_silence
from llm_health.remediator.store import Silence

log = logging.getLogger("llm_health.remediator")

SILENCE_MARGIN = 60.0          # seconds a restart's silence outlasts drain + action + warm-up
SILENCE_TIMEOUT = 3.0          # HTTP timeout towards Alertmanager (never blocks a restart for long)


def silence_seconds(ctx: Context) -> float:
    r = ctx.r
    return r.drain_timeout + r.action_timeout + r.warmup_timeout + SILENCE_MARGIN


def silence(ctx: Context, incident_id: int, backend: Backend) -> None:
    """Mute the backend's alerts for the whole restart (it ends by itself if we crash)."""
    am = ctx.r.alertmanager_url
    if not am:
        return
    seconds = silence_seconds(ctx)
    try:
        sid = create_silence(am, backend.name, seconds / 60.0,
                             f"llm-health remediator: restart of {backend.name} (incident {incident_id})",
                             "llm-health-remediator", timeout=SILENCE_TIMEOUT)
    except SilenceError as exc:
        now = ctx.clocks.wall()
        with ctx.store.tx() as tx:
            tx.bump("silences", "create_failed")
            tx.event(now, "silence_failed", backend.name, incident_id,
                     reason=f"could not silence the restart's alerts (restart goes on): {exc}")
        return
    now = ctx.clocks.wall()
    with ctx.store.tx() as tx:
        tx.add_silence(Silence(sid, backend.name, incident_id, now, now + seconds))
        tx.bump("silences", "created")
        tx.event(now, "silence_created", backend.name, incident_id,
                 reason=f"alerts with backend={backend.name} silenced for {seconds:g}s (id {sid})", silence_id=sid)


def unsilence(ctx: Context, backend: str) -> None:
    am = ctx.r.alertmanager_url
    for s in ctx.store.active_silences(backend):
        try:
            if not am:
                raise SilenceError("remediator.alertmanager_url is no longer set")
            known = expire_silence(am, s.id, timeout=SILENCE_TIMEOUT)
        except SilenceError as exc:
            now = ctx.clocks.wall()
            with ctx.store.tx() as tx:
                tx.bump("silences", "expire_failed")
                tx.event(now, "silence_expire_failed", backend, s.incident_id,
                         reason=f"could not expire silence {s.id} (it ends by itself at its end time): {exc}",
                         silence_id=s.id)
                if now >= s.ends_at:
                    tx.end_silence(s.id, now, "ended")
            continue
        now = ctx.clocks.wall()
        with ctx.store.tx() as tx:
            tx.end_silence(s.id, now, "expired" if known else "gone")
            tx.bump("silences", "expired")
            tx.event(now, "silence_expired", backend, s.incident_id,
                     reason=f"silence {s.id} removed: the restart is over", silence_id=s.id)


def silence_safely(ctx: Context, incident_id: int, backend: Backend) -> None:
    try:
        silence(ctx, incident_id, backend)
    except Exception:  # noqa: BLE001 - silences never hold a restart back
        log.exception("silencing %s failed", backend.name)


def unsilence_safely(ctx: Context, backend: str) -> None:
    try:
        unsilence(ctx, backend)
    except Exception:  # noqa: BLE001 - the silence ends by itself at its end time
        log.exception("removing the silence of %s failed", backend)


def unsilence_fenced(ctx: Context, backend: str) -> None:
    """unsilence_safely, once a read of the store found the lease ours in the look's term (else NotLeading):
    a deposed holder expires no silence (the new holder's may be among them). A read is enough: no write
    follows in its transaction for the write lock to keep a takeover out of."""
    ctx.check_leading(ctx.store)
    unsilence_safely(ctx, backend)
