"""How long may a backend's counters stay frozen with work in flight before it is stalled? Pure.

During one engine step no counter moves. A stall is frozen counters for longer than the engine's own
steps can explain (principle 4), so the bound is derived per backend from what the engine says about
its steps, never a single number for every engine:

    bound = clamp(STEP_SAFETY x the longest plausible step, floor = stall_floor, ceiling = stall_ceiling)
    bound = stall_after, when the engine's numbers say nothing of its steps

Two floors, because what is known differs: `stall_after` (120 s) is the bound for an engine that says
nothing of its steps yet (a fresh process, a page without histograms): waiting long is the only safe
answer. `stall_floor` (30 s: two readings at the default 15 s interval) is the least bound for an engine
whose own numbers do bound its steps: a GPU engine whose slowest reported step is 0.4 s is judged stalled
after 30 s of frozen counters, not 120 s (issue 25: every second beyond the engine's longest legitimate
quiet period is paid by every user whose requests hang). The floor never exceeds `stall_after`, so a
test-scaled `stall_after` of 5 s keeps meaning 5 s.

The longest plausible step is the largest of what is known (`step_estimate`):

* the engine's latency histograms: the slowest step it has reported (`Reading.step_seconds`: the upper
  bound of the highest bucket with observations of vLLM's inter-token latency and request prefill time,
  SGLang's inter-token latency). Neither is a step: a chunked prefill spans many, an inter-token gap holds
  a preemption's wait or a pause. What was observed while this exporter read the process counts at most
  the longest pause it saw end or the longest gap between its readings (`histogram_step`): a longer single
  step would have shown as a pause that long;
* llama.cpp: its whole context as one prompt batch at the prompt speed it has measured itself
  (`context_tokens` from /props, else the largest sequence seen, times `prompt_seconds_total /
  prompt_tokens_total`): one `llama_decode` of a long prompt is one step, tens of seconds on a CPU;
* the longest pause with work that this exporter saw end in progress, on this process (`learned`).

A llama.cpp server that times prompts (`prompt_seconds_total`) but has not processed one yet says nothing
about its prompt speed, and its first prompt may be its longest step: its bound is the ceiling until it has. vLLM and SGLang split long
prompts into bounded steps (chunked prefill), so without histogram evidence the floor applies.
The reason of every stall verdict says which bound applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_health.exporter.reading import Reading

STEP_SAFETY = 2.0          # a step may take this many times the longest one seen or estimated


@dataclass(frozen=True)
class StepEstimate:
    seconds: float | None     # the longest plausible single step; None: nothing known
    why: str


@dataclass(frozen=True)
class QuietBound:
    seconds: float
    why: str                  # what set it: "stall_after", "2 x ...", "stall_ceiling"


Buckets = tuple[tuple[float, float, float], ...]


def histogram_step(reading: Reading, learned: float, watched_gap: float | None,
                   before: Buckets = ()) -> tuple[float | None, bool]:
    """(the longest step the latency histograms make plausible, whether longer observations were ruled out).
    A step of d seconds freezes every counter for d; when d is longer than the gap between two readings, one
    reading falls inside it, and the pause the exporter then sees end in progress (`learned`) is at least d.
    So for what a process observed since the exporter began to read it (`watched_gap` not None: the longest
    gap between its readings since; `before`: the buckets at its first reading, taken as they are), no step
    was longer than both `learned` and `watched_gap`:
    an observation beyond that was no single step (a chunked prefill: vLLM V1's default, its prefill time spans
    every chunk; a request's wait while preempted, in its inter-token gap; a pause the exporter did see, at
    `learned`), and one in a bucket reaching past it was at most that long."""
    longest: float | None = None
    ruled_out = False
    cap = None if watched_gap is None else max(learned, watched_gap)
    earlier = {(lo, hi): n for lo, hi, n in before}
    for low, high, n in reading.step_buckets:
        # observed while watched: judged against the cap; from before the watch (or unwatched): as it is
        if cap is not None and n > earlier.get((low, high), 0.0):
            if low >= cap:
                ruled_out = True
                continue
            if high > cap:
                ruled_out, high = True, cap
        longest = high if longest is None else max(longest, high)
    if not reading.step_buckets:
        longest = reading.step_seconds          # a reading built without the buckets (tests, old JSON)
    return longest, ruled_out


def step_estimate(reading: Reading | None, learned: float = 0.0, watched_gap: float | None = None,
                  before: Buckets = ()) -> StepEstimate:
    """The longest single step the engine's own numbers make plausible (largest of what is known)."""
    candidates: list[tuple[float, str]] = []
    if reading is not None:
        step, ruled_out = histogram_step(reading, learned, watched_gap, before)
        if step is not None:
            candidates.append((step, f"the slowest step it reported ({step:g} s)" + (
                "; longer ones were no single step: seen progressing" if ruled_out else "")))
        per_token = reading.prompt_seconds_per_token
        context = reading.context_tokens or reading.tokens_max
        if per_token is not None and context:
            source = "context" if reading.context_tokens else "longest sequence seen"
            candidates.append((per_token * context, f"a {context:.0f}-token prompt step ({source}) at "
                               f"{per_token * 1000:.1f} ms/token ({per_token * context:.0f} s)"))
    if learned > 0:
        candidates.append((learned, f"the longest pause seen end in progress ({learned:.0f} s)"))
    if not candidates:
        return StepEstimate(None, "nothing known of its steps")
    seconds, why = max(candidates)
    return StepEstimate(seconds, why)


def unbounded_first_step(reading: Reading | None) -> bool:
    """llama.cpp before its first prompt (it times prompts, and has timed none yet): its first step may be
    its longest, and nothing bounds it. A page that does not time prompts at all says nothing either way."""
    return (reading is not None and reading.flavour == "llamacpp" and reading.prompt_timing
            and reading.prompt_seconds_per_token is None and not reading.step_seconds)


def quiet_bound(reading: Reading | None, learned: float, stall_after: float, ceiling: float,
                stall_floor: float | None = None, watched_gap: float | None = None,
                before: Buckets = ()) -> QuietBound:
    """How long counters may stay frozen with work before the backend is stalled (see module doc).
    `stall_floor` None: stall_after is the floor for known steps too (the bound before issue 25)."""
    ceiling = max(ceiling, stall_after)
    estimate = step_estimate(reading, learned, watched_gap, before)
    if estimate.seconds is None:
        if unbounded_first_step(reading):
            return QuietBound(ceiling, f"stall_ceiling {ceiling:g} s: llama.cpp has processed no prompt yet, "
                              "so nothing bounds its first step")
        return QuietBound(stall_after, f"stall_after {stall_after:g} s")
    wanted = STEP_SAFETY * estimate.seconds
    floor, name = ((stall_after, "stall_after") if stall_floor is None or stall_floor >= stall_after
                   else (stall_floor, "stall_floor"))
    if wanted <= floor:
        return QuietBound(floor, f"{name} {floor:g} s (longest step: {estimate.why})")
    if wanted >= ceiling:
        return QuietBound(ceiling, f"stall_ceiling {ceiling:g} s ({STEP_SAFETY:g} x {estimate.why} is more)")
    return QuietBound(wanted, f"{STEP_SAFETY:g} x {estimate.why}")


def required_span(reading: Reading | None, learned: float, ceiling: float) -> float:
    """For a re-check that starts after the stall was seen (verify): how long its readings must show the
    counters frozen so that no legitimate step explains it (no floor: the alert waited that out)."""
    estimate = step_estimate(reading, learned)
    if estimate.seconds is None:
        return ceiling if unbounded_first_step(reading) else 0.0
    return min(STEP_SAFETY * estimate.seconds, ceiling)
