"""The read scheduler against a real HTTP fake (tests/support/fakevllm.py): which reads count, when a
reading counts as taken, when a probe may go out."""

from __future__ import annotations

from llm_health.config import Backend, ExporterSettings
from llm_health.drill.procs import wait_until
from llm_health.exporter.scheduler import ReadScheduler
from llm_health.exporter.verdict import Verdict


def test_a_read_finishing_after_the_cycle_gave_up_is_never_used_later(fake) -> None:
    """The reviewer's case: an idle page that arrives late must not allow a probe of a busy server."""
    f = fake()
    f.drip = True
    fleet = ReadScheduler([Backend(name="a", url=f.url)], [],
                  ExporterSettings(interval=0.3, read_timeout=1.0, probe_timeout=2.0))
    try:
        slot = fleet.backends[0]
        fleet.read_all(due=0.0)  # the idle page is still dripping at the read's deadline
        # the exchange ended by its own total deadline: the dripped page is never read, late or not
        assert slot.read is None or slot.read.done()
        assert slot.readings["timeout"] == 1 and slot.probes_sent == 0
        f.release.set()
        f.drip = False
        f.set("0", running=2, gen=150)  # busy by the next cycle
        before = f.metrics_done
        fleet.read_all(due=1.0)
        assert f.metrics_done >= before + 1  # a new read was made (the dripped one may have ended too)
        assert slot.readings["ok"] == 1 and slot.readings["timeout"] == 1  # ...and the late one not counted
        assert slot.state.in_flight == 2 and slot.state.verdict != Verdict.IDLE
        assert slot.probes_sent == 0 and slot.probe is None
        assert f.probes == 0 and f.probes_while_busy == 0
        # the server is idle again: a fresh idle reading may probe
        f.set("0", running=0, gen=160)
        fleet.read_all(due=2.0)
        wait_until(lambda: slot.probes_sent == 1, timeout=5, what="the probe sent (counted by its worker)")
        wait_until(lambda: f.probes == 1, timeout=5, what="probe arrives")
        assert f.probes_while_busy == 0
    finally:
        f.release.set()
        fleet.close()


def test_a_slow_answer_is_judged_with_the_time_it_came(fake) -> None:
    """A page that took 0.4 s shows counters of up to 0.4 s after it was asked for: the verdict gets that
    time (`answered`), so its frozen clock starts then; a prompt page is judged at its scheduled time."""
    f = fake()
    f.set("0", running=2, gen=100)
    fleet = ReadScheduler([Backend(name="a", url=f.url)], [],
                          ExporterSettings(interval=1.0, read_timeout=2.0, probe_timeout=2.0))
    try:
        slot = fleet.backends[0]
        fleet.read_all()
        assert slot.state.last_seen == slot.state.last_at          # prompt: judged at its scheduled time
        f.delay = 0.4
        f.set("0", running=2, gen=150)
        fleet.read_all()
        state = slot.state
        assert state.verdict == Verdict.BUSY and state.last_at is not None and state.last_seen is not None
        assert state.last_seen - state.last_at >= 0.35, (state.last_at, state.last_seen)
        assert state.last_progress == state.last_seen
    finally:
        fleet.close()


def test_a_stalled_llamacpp_is_published_as_read_from_its_loop(fake) -> None:
    """/verdicts says of a stalled backend whether its pages come from the inference loop (llama.cpp), so a
    verification whose every endpoint but /health hangs knows what the exporter read (exporter/check.py)."""
    from dataclasses import replace

    from llm_health.exporter.app import verdicts_document
    from llm_health.exporter.observation import Observation, ReadResult
    from llm_health.exporter.reading import read_text
    from llm_health.exporter.verdict import Thresholds, judge
    from tests.support.paths import PAGES

    busy = read_text((PAGES / "llamacpp-b11434-busy.txt").read_text())
    t = Thresholds(stall_after=10.0, down_after=2, stall_readings=2)
    (key, eng), = busy.engines.items()
    moved = replace(busy, engines={key: replace(eng, counters={n: v + 1 for n, v in eng.counters.items()})})
    state = judge(judge(None, Observation(ReadResult.OK, busy), 0.0, t), Observation(ReadResult.OK, moved), 1.0, t)
    assert state.last_progress == 1.0
    for at in range(2, 40):
        state = judge(state, Observation(ReadResult.TIMEOUT, detail="no answer"), float(at), t)
    assert state.verdict == Verdict.STALLED, state.reason
    f = fake()
    fleet = ReadScheduler([Backend(name="a", url=f.url)], [], ExporterSettings(interval=1.0, read_timeout=1.0))
    try:
        slot = fleet.backends[0]
        slot.state = state
        fleet._publish(slot)
        row = verdicts_document(fleet.snapshot())["backends"][0]
        assert row["verdict"] == "stalled" and row["page_is_work_queue"] is True
        again = replace(busy, engines={key: replace(eng, counters={n: v + 2 for n, v in eng.counters.items()})})
        slot.state = judge(state, Observation(ReadResult.OK, again), 41.0, t)   # it moves again: busy
        assert slot.state.verdict == Verdict.BUSY
        fleet._publish(slot)
        row = verdicts_document(fleet.snapshot())["backends"][0]
        assert "page_is_work_queue" not in row
    finally:
        fleet.close()


def test_a_probe_that_waited_in_the_pool_never_reaches_a_server_that_took_work(fake) -> None:
    """The fleet's probes share one pool of PROBE_WORKERS: with that many idle servers' probes hanging until
    probe_timeout, a healthy backend's probe waited behind them and went out after its server had taken
    work, though the exporter's next reading already showed 2 running."""
    import threading

    from llm_health.exporter import scheduler as sched

    good_srv = fake()
    fleet = ReadScheduler([Backend(name="good", url=good_srv.url)], [],
                          ExporterSettings(interval=0.5, read_timeout=1.0, probe_timeout=3.0))
    release = threading.Event()
    try:
        hanging = [fleet._probes.submit(release.wait, 10.0) for _ in range(sched.PROBE_WORKERS)]  # hung probes
        good = fleet.backends[0]
        fleet.read_all(due=0.0)                 # good reads idle: its probe is queued behind them
        assert good.probe is not None and not good.probe.done() and good.probes_sent == 0
        good_srv.set("0", running=2, gen=150)
        fleet.read_all(due=0.5)
        assert good.state.in_flight == 2        # the exporter knows it is busy now
        release.set()
        wait_until(lambda: all(h.done() for h in hanging) and good.probe is not None and good.probe.done(),
                   timeout=10, what="the queued probe's turn")
        assert good_srv.probes == 0 and good.probes_sent == 0, "a probe reached a server with 2 running"
        fleet.read_all(due=1.0)
        assert good.probes.get("not_sent") == 1
    finally:
        release.set()
        fleet.close()


def test_a_probe_that_goes_out_is_counted_in_the_published_view_at_once(fake) -> None:
    """Counted by the probe's worker when it goes out, the probe did not show in /metrics and /verdicts until
    the backend's next judgement, an interval later: a probe that hangs the server was not in the count."""
    import threading

    from llm_health.exporter import scheduler as sched
    from llm_health.exporter.observation import ProbeResult

    srv = fake()
    fleet = ReadScheduler([Backend(name="a", url=srv.url)], [],
                          ExporterSettings(interval=0.5, read_timeout=1.0, probe_timeout=3.0))
    entered, release, others = threading.Event(), threading.Event(), threading.Event()
    slot = fleet.backends[0]

    def hung_probe() -> ProbeResult:      # the probe went out and the server hangs on it
        entered.set()
        release.wait(10)
        return ProbeResult("timeout", "no answer")

    slot.prober.probe = hung_probe
    try:
        busy = [fleet._probes.submit(others.wait, 10.0) for _ in range(sched.PROBE_WORKERS)]  # other probes
        fleet.read_all(due=0.0)            # idle page: the probe is queued behind the others
        others.set()                       # theirs end at once: ours goes out, the page still fresh
        wait_until(entered.is_set, timeout=5, what="the probe goes out")
        assert all(b.done() for b in busy) and slot.probes_sent == 1

        assert next(b for b in fleet.snapshot().backends if b.name == "a").probes_sent == 1
    finally:
        others.set()
        release.set()
        fleet.close()


def test_no_probe_once_a_newer_look_failed(fake) -> None:
    """The idle page was no longer the latest look once a newer read failed (check.py's verify refuses the
    same); the queued probe still went out, to a server that had taken work."""
    import threading

    from llm_health.exporter import scheduler as sched

    srv = fake()
    fleet = ReadScheduler([Backend(name="a", url=srv.url)], [],
                          ExporterSettings(interval=0.5, read_timeout=1.0, probe_timeout=3.0))
    others = threading.Event()
    slot = fleet.backends[0]
    try:
        busy = [fleet._probes.submit(others.wait, 10.0) for _ in range(sched.PROBE_WORKERS)]
        fleet.read_all(due=0.0)                     # idle page: the probe is queued behind the others
        assert slot.probe is not None and not slot.probe.done()
        srv.set("0", running=2, gen=150)            # the server takes work ...

        def broken() -> str:
            raise RuntimeError("page failed")       # ... and its /metrics answer fails at once
        srv.page = broken
        fleet.read_all(due=0.5)
        assert slot.last_outcome == "error", slot.last_outcome
        others.set()
        wait_until(lambda: slot.probe is not None and slot.probe.done(), timeout=5, what="the queued probe's turn")
        assert srv.probes_while_busy == 0 and slot.probes_sent == 0, "probed after the latest look failed"
        assert all(b.done() for b in busy)
    finally:
        others.set()
        fleet.close()
