"""Small parts of the remediator: payload validation and dedup keys, marker files, the action runner."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from llm_health.remediator import action
from llm_health.remediator.alert import PayloadError, parse_notification
from llm_health.remediator.marker import file_markers, write_marker_file

from tests.support.alerts import alert, payload

# a real Alertmanager 0.25 payload (docs: reference facts §1.1)
AM_025 = {
    "receiver": "hook", "status": "firing",
    "alerts": [{
        "status": "firing",
        "labels": {"alertname": "AppStuck", "cluster": "e2e", "instance": "127.0.0.1:18000", "job": "app",
                   "severity": "critical"},
        "annotations": {"summary": "stuck on 127.0.0.1:18000"},
        "startsAt": "2026-11-29T18:17:48.51Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://vm:19090/graph?g0.expr=app_stuck+%3D%3D+1&g0.tab=1",
        "fingerprint": "ab26b92c61261eb6",
    }],
    "groupLabels": {"alertname": "AppStuck"}, "commonLabels": {}, "commonAnnotations": {},
    "externalURL": "http://vm:19093", "version": "4", "groupKey": "{}:{alertname=\"AppStuck\"}",
    "truncatedAlerts": 0,
}


def test_parses_a_real_alertmanager_payload() -> None:
    n = parse_notification(AM_025)
    assert n.status == "firing" and n.group_key == '{}:{alertname="AppStuck"}'
    (a,) = n.alerts
    assert a.name == "AppStuck" and a.fingerprint == "ab26b92c61261eb6" and not a.wants_restart
    assert a.labels["instance"] == "127.0.0.1:18000"


def test_dedup_key_ignores_external_url_and_order_but_not_status_or_firing() -> None:
    a1, a2 = alert(), alert(alertname="LLMBackendDown")
    key = parse_notification(payload(a1, a2)).dedup_key()
    assert parse_notification(payload(a2, a1, external="http://am-1:9093")).dedup_key() == key
    assert parse_notification(payload(a1, a2, receiver="other")).dedup_key() == key
    assert parse_notification(payload(a1)).dedup_key() != key
    refired = alert(starts_at="2026-11-30T01:00:00Z")
    assert parse_notification(payload(refired, a2)).dedup_key() != key
    resolved = payload(alert(status="resolved"), alert(alertname="LLMBackendDown", status="resolved"))
    assert parse_notification(resolved).dedup_key() != key


@pytest.mark.parametrize("bad", [
    None, [], "x", {"alerts": None}, {"alerts": [1]}, {"alerts": [{"status": "firing", "labels": []}]},
    {"alerts": [{"status": "firing", "labels": {"a": "b" * 5000}}]},
    {"alerts": [{"status": "firing", "labels": {}, "fingerprint": 5}]},
    {"version": 4, "alerts": []},
    {"alerts": [{"status": "firing", "labels": {}}] * 1001},
])
def test_bad_payloads_say_why(bad: object) -> None:
    with pytest.raises(PayloadError) as exc:
        parse_notification(bad)
    assert str(exc.value)


def test_missing_fingerprint_is_derived_from_labels() -> None:
    body = payload(alert())
    del body["alerts"][0]["fingerprint"]
    one = parse_notification(body).alerts[0].fingerprint
    assert one and one == parse_notification(body).alerts[0].fingerprint


def test_marker_files(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    assert file_markers(busy, "gpu-a", 100, now=time.time()) == ()   # no folder: no markers
    busy.mkdir()
    (busy / "gpu-a").write_text("")                               # bare name, default ttl
    (busy / "gpu-a@job1").write_text("ttl=30\n")
    (busy / "gpu-a@job2").write_text("45")
    (busy / "gpu-ab@job").write_text("")                          # not gpu-a
    (busy / "gpu-a.b").write_text("")                             # backend gpu-a.b's, not gpu-a's
    (busy / ".gpu-a@tmp").write_text("")                          # hidden: ignored
    now = time.time()
    for p in busy.iterdir():
        os.utime(p, (now, now))
    markers = {m.id: m for m in file_markers(busy, "gpu-a", 100, now=time.time())}
    assert set(markers) == {"file:gpu-a", "file:gpu-a@job1", "file:gpu-a@job2"}
    assert markers["file:gpu-a"].expires_at == pytest.approx(now + 100, abs=1)
    assert markers["file:gpu-a@job1"].expires_at == pytest.approx(now + 30, abs=1)
    assert markers["file:gpu-a@job2"].expires_at == pytest.approx(now + 45, abs=1)
    path = write_marker_file(busy, "gpu-b", 12, "tag")
    assert path.name == "gpu-b@tag"
    (m,) = file_markers(busy, "gpu-b", 100, now=time.time())
    assert m.valid(time.time()) and m.expires_at == pytest.approx(time.time() + 12, abs=2)


def test_a_marker_file_from_the_future_holds_for_its_ttl_only(tmp_path: Path) -> None:
    """An mtime in the future (`touch -d 2035-01-01`, a writer's skewed clock; a 3650-day marker was seen)
    is not believed: the marker expires its (capped) TTL after it was set, and stays expired at a later
    look, though its mtime is still ahead."""
    busy = tmp_path / "busy"
    busy.mkdir()
    before = time.time()
    future = before + 3650 * 86400
    for name, text in (("gpu-a@default", ""), ("gpu-a@ttl", "ttl=30\n"), ("gpu-a@huge", "ttl=99999999\n")):
        (busy / name).write_text(text)
        os.utime(busy / name, (future, future))
    (busy / "gpu-a@past").write_text("ttl=30\n")
    os.utime(busy / "gpu-a@past", (before - 10, before - 10))                # a past mtime is kept as it is
    after = time.time()
    now = after + 5
    markers = {m.id: m.expires_at for m in file_markers(busy, "gpu-a", 100, 3600, now=now)}
    assert set(markers) == {"file:gpu-a@default", "file:gpu-a@ttl", "file:gpu-a@huge", "file:gpu-a@past"}
    for name, ttl in (("default", 100), ("ttl", 30), ("huge", 3600)):
        assert before - 1 + ttl <= markers[f"file:gpu-a@{name}"] <= after + 1 + ttl, name
    assert markers["file:gpu-a@past"] == pytest.approx(before + 20)
    # looked at again once the TTLs have run out: expired, every one, though the mtimes are still ahead
    later = after + 3601
    assert [m.id for m in file_markers(busy, "gpu-a", 100, 3600, now=later) if m.valid(later)] == []
    # and a remediator whose clock is behind the file's (NFS, skew) counts from its own now, not later
    behind = {m.id: m.expires_at for m in file_markers(busy, "gpu-a", 100, 3600, now=before - 1000)}
    assert behind["file:gpu-a@default"] == before - 1000 + 100


def test_unusable_busy_dir_fails_closed(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.write_text("a file where a folder should be")
    (m,) = file_markers(busy, "gpu-a", 100, now=time.time())
    assert m.valid(time.time()) and "unreadable busy_dir" in m.owner


def test_action_runs_argv_without_shell(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = f"import sys, os; open({str(out)!r}, 'w').write(repr(sys.argv[1:]) + os.environ['LLM_HEALTH_BACKEND'])"
    r = action.run_action([sys.executable, "-c", code, "$(id)", "; rm -rf /"], timeout=10,
                          env={"LLM_HEALTH_BACKEND": "gpu-a"})
    assert r.result == action.OK and r.exit_code == 0
    assert out.read_text() == "['$(id)', '; rm -rf /']gpu-a"


def test_action_failure_timeout_and_output_truncation() -> None:
    r = action.run_action([sys.executable, "-c", "import sys; print('x' * 10000); sys.exit(4)"], timeout=10)
    assert r.result == action.FAILED and r.exit_code == 4
    assert len(r.output) < 4100 and "[truncated]" in r.output
    r = action.run_action([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                          timeout=0.5)
    assert r.result == action.TIMEOUT and r.outcome_unknown and "started" in r.output
    r = action.run_action(["/nonexistent/restart-me"], timeout=1)
    assert r.result == action.FAILED and r.exit_code is None and "cannot start" in r.output


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


def test_marker_files_that_never_end_do_not_block_the_claim(tmp_path: Path) -> None:
    """file_markers runs inside the claim's BEGIN IMMEDIATE: a FIFO (a job's mistake in the group-writable
    busy_dir) or a link to /dev/zero must neither block nor read forever; each still counts as a marker."""
    import threading

    busy = tmp_path / "busy"
    busy.mkdir()
    os.mkfifo(busy / "gpu-a@fifo")                  # opening it for reading blocks until a writer comes
    (busy / "gpu-a@zero").symlink_to("/dev/zero")   # reading it never reaches end-of-file
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(file_markers(busy, "gpu-a", 100, now=time.time())),
                         daemon=True)
    t.start()
    t.join(timeout=10)
    if t.is_alive():                                # unblock the reader so the test process can end
        with open(busy / "gpu-a@fifo", "w"):
            pass
        t.join(timeout=10)
        pytest.fail("file_markers blocked on a FIFO in busy_dir")
    (markers,) = out
    assert {m.id for m in markers} == {"file:gpu-a@fifo", "file:gpu-a@zero"}   # type: ignore[attr-defined]
    fifo = next(m for m in markers if m.id == "file:gpu-a@fifo")                # type: ignore[attr-defined]
    assert fifo.valid(time.time()) and fifo.expires_at == pytest.approx(time.time() + 100, abs=5)
