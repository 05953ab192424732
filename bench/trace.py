"""The incident day's traffic, seeded: identical for every checker's world.

* interactive requests: open-loop arrivals (a Poisson process whose rate changes by the hour),
  chat-sized prompts, a share of long prompts (long chunked prefills); a failed one is lost;
* batch jobs: closed-loop clients (`concurrency` workers, each sends its next item when the last
  one finished; a failed item is retried after `retry_after` s). Item sizes come from the job's
  own seeded sequence, so item i is the same in every world; only its timing depends on the world;
* stalls: times at which the engine stops stepping until the server is restarted;
* pauses (the harder day): quiet periods with work in flight that end on their own (a garbage collection,
  a preemption storm, a driver hiccup): the engine takes no step for a while, then carries on;
* sleeps (the harder day): the engine is put to sleep (vLLM sleep mode) once it is idle, and woken later;
  traffic meant for it goes elsewhere meanwhile.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

HOUR = 3600.0


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class BatchJob:
    name: str
    start: float
    end: float                 # no new item starts after this
    concurrency: int
    items: tuple[tuple[int, int], ...]   # (prompt_tokens, max_tokens), sent in order
    retry_after: float = 30.0


@dataclass(frozen=True)
class Trace:
    seed: int
    duration: float
    interactive: tuple[Arrival, ...]
    batches: tuple[BatchJob, ...]
    stalls: tuple[float, ...]
    notes: dict[str, str] = field(default_factory=dict)
    pauses: tuple[tuple[float, float], ...] = ()     # (start, seconds): quiet with work, then on by itself
    sleeps: tuple[tuple[float, float], ...] = ()     # (start, seconds) asleep


# requests per hour of interactive traffic, hour 0..23: idle night, working day, idle evening
HOURLY_RATE = (1, 1, 1, 1, 1, 1, 2, 10, 30, 40, 40, 40, 30, 40, 40, 40, 30, 30, 20, 10, 4, 3, 2, 1)
LONG_PROMPT_SHARE = 0.12        # of daytime interactive requests: 16k-40k-token prompts


def _interactive(rng: random.Random, duration: float, f: float, long_prompts: tuple[int, int] = (16_000, 40_000),
                 long_share: float = LONG_PROMPT_SHARE) -> list[Arrival]:
    """Arrivals at the hourly rates; `f` < 1 squeezes the day's shape (not its density) into `duration`."""
    out: list[Arrival] = []
    t = 0.0
    while True:
        rate = HOURLY_RATE[int(t / (HOUR * f)) % 24] / HOUR
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        hour = int(t / (HOUR * f)) % 24
        if 8 <= hour < 19 and rng.random() < long_share:
            prompt = rng.randint(*long_prompts)            # a document pasted into the chat
        else:
            prompt = int(min(max(rng.lognormvariate(6.5, 0.9), 30), 8_000))
        out.append(Arrival(round(t, 3), prompt, rng.randint(64, 512)))


def _items(rng: random.Random, n: int, prompt: tuple[int, int], gen: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    return tuple((rng.randint(*prompt), rng.randint(*gen)) for _ in range(n))


def incident_day(seed: int = 8, duration: float = 24 * HOUR) -> Trace:
    """The day of the incident (times in seconds from midnight); a shorter `duration` squeezes its shape."""
    rng = random.Random(seed)
    f = duration / (24 * HOUR)   # a shorter "day" keeps the same shape

    def at(h: float, jitter: float = 0.0) -> float:
        return round(h * HOUR * f + jitter, 3)

    batches = (
        # the incident's batch job: 2-4 requests busy for minutes each (~1000-2000 tokens at ~8 tokens/s)
        BatchJob("batch-morning", at(9, 7.31), at(12), 3, _items(rng, 400, (1_000, 4_000), (960, 1_920))),
        # the saturated afternoon: the same job fanned out wider than the server's 12 slots
        BatchJob("batch-saturated", at(13, 4.87), at(15.5), 24, _items(rng, 1_500, (1_000, 4_000), (960, 1_920))),
        BatchJob("batch-evening", at(16, 11.43), at(18.5), 2, _items(rng, 400, (1_000, 4_000), (960, 1_920))),
    )
    stalls = (at(3.2), at(10.7), at(14.2), at(17.4))
    return Trace(
        seed=seed,
        duration=duration,
        interactive=tuple(_interactive(rng, duration, f)),
        batches=batches,
        stalls=stalls,
        notes={
            "03:12": "stall while idle (night)",
            "10:42": "stall under the morning batch (3 requests in flight)",
            "14:12": "stall in the saturated afternoon (12 of 12 running, a queue)",
            "17:24": "stall under the evening batch (2 requests in flight)",
        },
    )


PAUSE_SECONDS = (2.0, 25.0)     # a quiet period that ends by itself: at most this long (the floor is 30 s)


def harder_day(seed: int = 8, duration: float = 24 * HOUR) -> Trace:
    """The incident day made harder (issue 25): the same batch jobs and stalls, plus
    * prompts up to 120k tokens (a chunked prefill of ~30 s of steps, the KV gauge growing chunk by chunk);
    * 40 quiet periods of 2-25 s with work in flight that end on their own (GC, a preemption storm);
    * the engine put to sleep twice (night and evening) and woken again;
    0 false restarts and every stall caught, at the defaults."""
    base = incident_day(seed=seed, duration=duration)
    rng = random.Random(f"harder-{seed}")
    f = duration / (24 * HOUR)
    interactive = _interactive(rng, duration, f, long_prompts=(40_000, 120_000), long_share=0.2)
    stall_times = set(base.stalls)
    pauses: list[tuple[float, float]] = []
    while len(pauses) < max(4, int(40 * f)):
        at = round(rng.uniform(7 * HOUR * f, 19 * HOUR * f), 3)      # by day, when there is work
        if all(abs(at - s) > 900 * f + 60 for s in stall_times) and all(abs(at - p) > 120 for p, _ in pauses):
            pauses.append((at, round(rng.uniform(*PAUSE_SECONDS), 1)))
    sleeps = ((round(1.0 * HOUR * f, 3), round(1.5 * HOUR * f, 3)), (round(20.5 * HOUR * f, 3), round(1.0 * HOUR * f, 3)))
    notes = {**base.notes,
             "pauses": f"{len(pauses)} quiet periods of {PAUSE_SECONDS[0]:g}-{PAUSE_SECONDS[1]:g} s with work "
                       "(07:00-19:00) that end on their own",
             "sleeps": "asleep 01:00-02:30 and 20:30-21:30",
             "prompts": "20 % of daytime interactive prompts 40k-120k tokens"}
    return Trace(seed=seed, duration=duration, interactive=tuple(interactive), batches=base.batches,
                 stalls=base.stalls, notes=notes, pauses=tuple(sorted(pauses)), sleeps=sleeps)
