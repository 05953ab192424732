"""Busy markers as files (remediator/marker.py): exact names, TTLs and their cap, mtimes from the
future, an unusable busy_dir and files that never end; a marker holds a restart for its TTL only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.config import ConfigError, parse_config
from llm_health.remediator.marker import file_markers, write_marker_file
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


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


def test_f7_marker_names_match_exactly(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "gpu.a").write_text("")
    (busy / ".gpu").write_text("")
    assert file_markers(busy, "gpu", 100, now=time.time()) == ()     # gpu.a is backend gpu.a's, .gpu is hidden
    assert [m.id for m in file_markers(busy, "gpu.a", 100, now=time.time())] == ["file:gpu.a"]
    with pytest.raises(ConfigError, match="name"):
        parse_config({"backends": [{"name": ".gpu", "url": "http://127.0.0.1:1"}]})


def test_f7_every_marker_has_a_ttl_cap(w: World, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir(exist_ok=True)
    (busy / "gpu-a").write_text("ttl=99999999999\n")
    (m,) = file_markers(busy, "gpu-a", 3600, 86400, now=time.time())
    assert m.expires_at <= os.stat(busy / "gpu-a").st_mtime + 86400
    r = w.client.post("/api/busy", json={"backend": "gpu-a", "owner": "me", "ttl_seconds": 7 * 86400}, headers=AUTH)
    assert r.status_code == 400 and "marker_max_ttl" in r.get_json()["error"]
    with pytest.raises(ConfigError, match="busy_file_ttl"):
        parse_config({"remediator": {"busy_file_ttl": 100000, "marker_max_ttl": 3600}})


def test_file_marker_defers_and_expired_file_is_ignored(w: World, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    marker = busy / "gpu-a@nightly-eval"
    marker.write_text("ttl=600\n")
    os.utime(marker, (w.clock.t, w.clock.t))
    (busy / "gpu-ab").write_text("")                  # another name: not a marker for gpu-a
    holds_for_its_ttl(w, 601)


def holds_for_its_ttl(w: World, ttl: float) -> None:
    """An alert about gpu-a: deferred by the marker, then restarted once `ttl` has passed."""
    w.post(payload(alert()))
    w.run()
    assert w.calls == [] and w.kinds("gpu-a")[-1] == "deferred_marker"
    w.clock.advance(ttl)
    w.run()
    assert w.calls == [("restart-a", "--now")]


def test_file_marker_with_a_future_mtime_holds_for_its_ttl_only(w: World, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    marker = busy / "gpu-a@skewed"
    marker.write_text("ttl=600\n")
    w.clock.t = time.time()                           # the kernel's ctime of the file is real time
    future = w.clock.t + 3650 * 86400                 # seen in the field: a marker valid for ten years
    os.utime(marker, (future, future))
    holds_for_its_ttl(w, 601)
