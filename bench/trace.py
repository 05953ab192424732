"""The incident day's traffic, seeded: identical for every checker's world.

* interactive requests: open-loop arrivals (a Poisson process whose rate changes by the hour),
  chat-sized prompts, a share of long prompts (long chunked prefills); a failed one is lost;
* batch jobs: closed-loop clients (`concurrency` workers, each sends its next item when the last
  one finished; a failed item is retried after `retry_after` s). Item sizes come from the job's
  own seeded sequence, so item i is the same in every world; only its timing depends on the world;
* stalls: times at which the engine stops stepping until the server is restarted.
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


# requests per hour of interactive traffic, hour 0..23: idle night, working day, idle evening
HOURLY_RATE = (1, 1, 1, 1, 1, 1, 2, 10, 30, 40, 40, 40, 30, 40, 40, 40, 30, 30, 20, 10, 4, 3, 2, 1)
LONG_PROMPT_SHARE = 0.12        # of daytime interactive requests: 16k-40k-token prompts


def _interactive(rng: random.Random, duration: float, f: float) -> list[Arrival]:
    """Arrivals at the hourly rates; `f` < 1 squeezes the day's shape (not its density) into `duration`."""
    out: list[Arrival] = []
    t = 0.0
    while True:
        rate = HOURLY_RATE[int(t / (HOUR * f)) % 24] / HOUR
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        hour = int(t / (HOUR * f)) % 24
        if 8 <= hour < 19 and rng.random() < LONG_PROMPT_SHARE:
            prompt = rng.randint(16_000, 40_000)           # a document pasted into the chat
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
