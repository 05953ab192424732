"""A deposed lease holder leaves a restart's outcome and its silence to the new holder (issue 18).

Two authorities on one state file; the real action wrapper (its exit status in a file); a fake
Alertmanager that records silences created and expired. Authority A claims and starts the restart,
loses its lease while the action runs (as when it is frozen past the lease), B takes over and collects
the real exit status from the wrapper's file. When A's action call finally returns, A must neither
record an outcome nor remove the silence of B's warm-up. Before: A logged `late_result (unknown)` for a
restart that exited 0 and expired the silence in the middle of B's warm-up.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from llm_health.config import parse_config
from llm_health.drill.procs import wait_until
from llm_health.exporter.observation import Verification
from llm_health.httpserver import QuietHandler
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.store import SqliteStore
from tests.support.alerts import alert, one_pass, payload
from tests.support.fakes import FakeClock
from tests.support.loopback import Loopback

TOKEN = "takeover-token"


class FakeAlertmanager:
    def __init__(self) -> None:
        self.created: list[str] = []
        self.expired: list[str] = []
        am = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sid = f"s-{len(am.created) + 1}"
                am.created.append(sid)
                self.reply_json(200, {"silenceID": sid})

            def do_DELETE(self) -> None:  # noqa: N802
                am.expired.append(self.path.rsplit("/", 1)[-1])
                self.reply_json(200, {})

        self.server = Loopback(Handler)
        self.url = self.server.url


def test_a_deposed_holder_leaves_the_outcome_and_the_silence_to_the_new_holder(tmp_path: Path) -> None:
    am = FakeAlertmanager()
    flag = tmp_path / "go"
    script = tmp_path / "restart.py"
    script.write_text("import pathlib, sys, time\n"
                      f"while not pathlib.Path({str(flag)!r}).exists():\n    time.sleep(0.05)\nsys.exit(0)\n")
    (tmp_path / "token").write_text(TOKEN)
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18501", "restart": [sys.executable, str(script)]}],
        "remediator": {"state": "state.db", "token_file": "token", "poll_interval": 0.1, "warmup_poll": 1,
                       "warmup_timeout": 600, "action_timeout": 60, "alertmanager_url": am.url},
    }, source=str(tmp_path / "llm-health.yml"))
    wall, mono = FakeClock(1_000_000.0), FakeClock(5_000.0)
    app = create_app(config, clock=wall, with_authority=False)
    store: SqliteStore = app.extensions["remediator"].store

    def authority(holder: str) -> Authority:
        return Authority(store, config, clock=wall, mono=mono, holder=holder,
                         verifier=lambda b: Verification("down", "scripted"),
                         warmup_check=lambda b: (False, "still loading"), first_seen_check=lambda b: (True, "answers"),
                         in_flight=lambda b: InFlight(None, None, None, "refused"))
    a, b = authority("a"), authority("b")
    try:
        assert a.lease.renew()
        one_pass(a)
        r = app.test_client().post("/webhook", json=payload(alert("gpu-a")),
                                   headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 202
        acting = threading.Thread(target=one_pass, args=(a,), daemon=True)     # A claims and runs the action
        acting.start()
        wait_until(lambda: store.events(kind="restarting"), timeout=10, what="A started the restart")
        wait_until(lambda: list((tmp_path / "state.db.actions").glob("*.pid")), timeout=10, what="the wrapper")
        assert am.created == ["s-1"]

        mono.advance(a.lease.ttl + 1)                             # A is frozen past its lease ...
        assert b.lease.renew()                                    # ... and B takes over
        one_pass(b)                                                  # recover(): the wrapper still runs
        flag.write_text("")                                       # the restart ends: exit 0

        def collected() -> bool:
            mono.advance(1)
            wall.advance(1)
            b.lease.renew()
            one_pass(b)
            return bool(store.events(kind="restarted"))
        wait_until(collected, timeout=30, interval=0.2, what="B collected the exit status")
        acting.join(timeout=30)
        assert not acting.is_alive()

        inc = store.active_incident("gpu-a")
        assert inc is not None and inc.state == "warming"      # B's warm-up, undisturbed
        late = store.events(kind="late_result")
        assert len(late) == 1 and "lost the lease: recorded nothing" in late[0].reason, late
        assert store.events(kind="restarted")[0].detail.get("collected"), "B collected the wrapper's exit status"
        assert am.expired == [], "the deposed holder expired the silence of the new holder's warm-up"
        actions = store.conn().execute("SELECT result, exit_code, holder FROM actions").fetchall()
        assert [tuple(x) for x in actions] == [("ok", 0, "a")]
    finally:
        flag.write_text("")
        a.stop()
        b.stop()
        am.server.stop()
