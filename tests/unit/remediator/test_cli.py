"""`llm-health remediator` (remediator/cli.py) in-process: it refuses to start on a bad token or a corrupt
state, and its settings reach gunicorn.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_health.config import parse_config
from llm_health.remediator.app import create_app


def test_remediator_refuses_to_start_on_bad_token_or_corrupt_state(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from llm_health.cli import main

    cfg = tmp_path / "llm-health.yml"
    cfg.write_text("remediator: {token_file: missing-token, state: state.db}\n")
    assert main(["remediator", "--config", str(cfg)]) == 2
    assert "token_file" in capsys.readouterr().err
    (tmp_path / "missing-token").write_text("t")
    (tmp_path / "state.db").write_bytes(b"this is not a database" * 100)   # never silently reset
    assert main(["remediator", "--config", str(cfg)]) == 2
    assert "state" in capsys.readouterr().err
    assert main(["remediator", "--config", str(cfg), "--listen", "nonsense"]) == 2


def test_settings_reach_gunicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_health.remediator.buffering import ServingLimits
    from llm_health.remediator.cli import RemediatorServer
    from llm_health.remediator.serving import GuardedThreadWorker

    monkeypatch.setattr(GuardedThreadWorker, "limits", GuardedThreadWorker.limits)   # restored afterwards
    settings = {"request_timeout": 7, "idle_timeout": 2.5, "max_header_bytes": 4096, "max_body_bytes": 5000,
                "max_pending_connections": 100, "max_pending_per_peer": 10}
    server = RemediatorServer(parse_config({"remediator": settings}))
    assert GuardedThreadWorker.limits == ServingLimits(**settings)
    assert server.cfg.control_socket_disable is True
    assert server.cfg.keepalive == 3                          # gunicorn counts whole seconds
    assert server.cfg.worker_connections == 100 + 256
    assert server.cfg.worker_class is GuardedThreadWorker


def test_a_worker_sets_what_it_built_aside_from_the_garbage_collector_once_its_services_run() -> None:
    """gunicorn's post_worker_init starts the worker's services, then gc.freeze(): a full collection no longer
    walks the app, the store and the authority (a pause inside the state's write-lock turn holds every writer)."""
    import gc
    from types import SimpleNamespace

    from llm_health.remediator.cli import start_services

    started: list[bool] = []
    services = SimpleNamespace(start=lambda: started.append(gc.get_freeze_count() == 0), authority=None)
    worker = SimpleNamespace(wsgi=SimpleNamespace(extensions={"remediator": SimpleNamespace(services=services)}))
    gc.unfreeze()
    try:
        start_services(worker)
        assert started == [True]                   # the services started first (their threads' objects too)
        assert gc.get_freeze_count() > 1000        # then the heap was set aside
    finally:
        gc.unfreeze()


def test_a_worker_knows_when_it_holds_the_authority(tmp_path: Path) -> None:
    """serving.py: the worker that holds the lease leaves new connections to the other workers a moment."""
    from types import SimpleNamespace

    from llm_health.remediator.cli import start_services

    app = create_app(parse_config({"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:9", "restart": ["r"]}],
                                   "remediator": {"state": str(tmp_path / "state.db")}}), token="t")
    services = app.extensions["remediator"].services
    services.start = lambda: None
    worker = SimpleNamespace(wsgi=app)
    try:
        start_services(worker)
    finally:
        import gc
        gc.unfreeze()
    assert worker.leads() is False
    services.authority.lease.holding.set()
    assert worker.leads() is True
    services.authority.lease.holding.clear()
    assert worker.leads() is False
