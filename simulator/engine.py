"""A vLLM-like engine with continuous batching and an injected clock.

Time is whatever the caller says it is: `advance_to(t)` runs every engine step due up to `t`.
The HTTP server drives it with real (scaled) time from a thread; a discrete-event benchmark can
drive it with simulated time and never sleep.

Model (close to vLLM's V1 scheduler, simplified):
* at most `max_num_seqs` requests run; the rest wait in FIFO order;
* each step has a token budget of `chunk_tokens`: running requests in decode take one token each,
  then prefills take prompt chunks, then waiting requests are admitted while slots, budget and KV
  blocks allow;
* a step that completes a request's prefill emits its first token; every later step emits one
  token per running request; a request finishes when it has `max_tokens` tokens;
* KV blocks are allocated per computed token (`block_size` tokens a block); when a running request
  needs a block and none is free, the most recently admitted request is preempted (recompute).

Metrics bookkeeping follows the engine flavour: `v1` observes `iteration_tokens` only on steps that
emit output and credits the whole prompt at first-token time; `v0` observes every step, counts
prompt tokens per computed chunk and observes a 0 every `idle_log_seconds` while idle.
`sglang`: the scheduler publishes its gauges (running, queue, token usage) only on prefill batches,
every `decode_log_interval` decode batches (SGLang's default 40) and when it goes idle, so they can
be a few steps stale; it counts forward passes per mode. `llamacpp` (llama-server): one
`llama_decode` per step (`n_decode`), prompt tokens credited when a slot finishes its prompt,
generated tokens (`tokens_predicted`) credited **only when a request finishes**, the gauges are live.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (   # vLLM >= 0.8 (TPOT / ITL)
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
FINISHED_REASONS_V1: tuple[str, ...] = ("stop", "length", "abort")
FLAVOURS: tuple[str, ...] = ("v0", "v1", "sglang", "llamacpp")
SGLANG_DECODE_LOG_INTERVAL = 40

_ids = itertools.count(1)


class RequestState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass
class SimRequest:
    prompt_tokens: int
    max_tokens: int
    arrival: float
    request_id: int = field(default_factory=lambda: next(_ids))
    state: RequestState = RequestState.WAITING
    computed: int = 0  # tokens whose KV is computed (prompt, then generated ones)
    generated: int = 0
    recompute: int = 0  # generated tokens to prefill again after a preemption
    blocks: int = 0
    first_scheduled: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finished_reason: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.FAILED)

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prompt_tokens + self.recompute

    @property
    def prefill_remaining(self) -> int:
        return max(self.prompt_tokens + self.recompute - self.computed, 0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, +Inf last."""
        return [*zip(self.buckets, self.counts, strict=True), (math.inf, self.count)]


@dataclass
class EngineStats:
    """What the engine's stat logger has published (gauges as of the last step)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    steps: int = 0
    request_success: dict[str, int] = field(default_factory=dict)
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    finished: int = 0                 # requests finished (any reason)
    # sglang: forward passes per mode, decode batches since the gauges were last published
    prefill_passes: int = 0
    decode_passes: int = 0
    decode_since_log: int = 0
    # llamacpp: generated tokens credited at completion only, times, slot statistics
    tokens_predicted: int = 0
    prompt_seconds: float = 0.0
    predicted_seconds: float = 0.0
    busy_slot_decodes: int = 0        # sum over decodes of the busy slots (n_busy_slots_per_decode = this / steps)
    n_tokens_max: int = 0
    # llamacpp: the "bucket" since the previous /metrics read (llama-server resets it on every read)
    window_prompt_tokens: int = 0
    window_prompt_seconds: float = 0.0
    window_predicted_tokens: int = 0
    window_predicted_seconds: float = 0.0

    def take_window(self) -> tuple[float, float]:
        """llama-server's throughput gauges (prompt, predicted tokens/s) over the window since the
        previous /metrics read, and a new window: two scrapers steal each other's window."""
        prompt = self.window_prompt_tokens / self.window_prompt_seconds if self.window_prompt_seconds > 0 else 0.0
        predicted = (self.window_predicted_tokens / self.window_predicted_seconds
                     if self.window_predicted_seconds > 0 else 0.0)
        self.window_prompt_tokens = self.window_predicted_tokens = 0
        self.window_prompt_seconds = self.window_predicted_seconds = 0.0
        return prompt, predicted


class Engine:
    """One engine core (one DP rank). Not thread-safe: the caller serialises access."""

    def __init__(
        self,
        *,
        max_num_seqs: int = 12,
        step_seconds: float = 0.05,
        chunk_tokens: int = 512,
        kv_blocks: int = 2048,
        block_size: int = 16,
        flavour: str = "v1",
        idle_log_seconds: float = 10.0,
        start: float = 0.0,
        index: int = 0,
        decode_log_interval: int = SGLANG_DECODE_LOG_INTERVAL,
    ) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown engine flavour {flavour!r} ({', '.join(FLAVOURS)})")
        if max_num_seqs < 1 or step_seconds <= 0 or chunk_tokens < 1 or kv_blocks < 1 or block_size < 1:
            raise ValueError("max_num_seqs, step_seconds, chunk_tokens, kv_blocks, block_size must be positive")
        self.max_num_seqs = max_num_seqs
        self.step_seconds = step_seconds
        self.chunk_tokens = chunk_tokens
        self.kv_blocks = kv_blocks
        self.block_size = block_size
        self.flavour = flavour
        self.idle_log_seconds = idle_log_seconds
        self.index = index
        self.decode_log_interval = max(1, decode_log_interval)
        self.now = start
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.free_blocks = kv_blocks
        self.next_step_at: float | None = None
        self.next_idle_log_at: float | None = start + idle_log_seconds if flavour == "v0" else None
        self.stats = EngineStats()
        self.sleep_level = 0               # vLLM sleep mode: 0 awake, 1 weights offloaded, 2 discarded
        self.frozen = False                # freeze_until() since the last advance_to(): the loop runs nothing
        self.pending_aborts: list[SimRequest] = []   # clients gone while frozen: the loop takes them up later
        if flavour != "v0":
            self.stats.request_success = {reason: 0 for reason in FINISHED_REASONS_V1}

    # ------------------------------------------------------------------ queries
    @property
    def max_model_len(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return (self.kv_blocks - self.free_blocks) / self.kv_blocks

    # ------------------------------------------------------------------ commands
    def submit(self, prompt_tokens: int, max_tokens: int) -> SimRequest:
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be at least 1")
        if prompt_tokens + max_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion)."
            )
        req = SimRequest(prompt_tokens=prompt_tokens, max_tokens=max_tokens, arrival=self.now)
        self.waiting.append(req)
        if self.next_step_at is None:
            self.next_step_at = self.now + self.step_seconds
        return req

    def abort(self, req: SimRequest) -> None:
        """The client went away: free the request's slot (counted as finished_reason=abort). A frozen
        engine takes the abort up only when it runs again (the abort is a message to its loop; a wedged
        vLLM EngineCore counts nothing, so a stall never looks like progress)."""
        if req.done:
            return
        if self.frozen:
            if req not in self.pending_aborts:
                self.pending_aborts.append(req)
            return
        self._remove(req)
        req.state = RequestState.FINISHED
        req.finished_reason = "abort"
        req.finish_time = self.now
        self.stats.request_success["abort"] = self.stats.request_success.get("abort", 0) + 1
        self.stats.finished += 1  # llama-server: a cancelled slot is released without crediting its tokens
        self._publish_gauges(force=self.in_flight == 0)

    def fail_all(self, reason: str) -> list[SimRequest]:
        """The process died: every in-flight request fails (those whose client is gone already answer nobody)."""
        gone = {r.request_id for r in self.pending_aborts}
        self.pending_aborts.clear()
        failed = [*self.running, *self.waiting]
        for req in failed:
            req.state = RequestState.FAILED
            req.error = reason
            req.finish_time = self.now
        self.running.clear()
        self.waiting.clear()
        self.free_blocks = self.kv_blocks
        self.next_step_at = None
        return [r for r in failed if r.request_id not in gone]

    def freeze_until(self, t: float) -> None:
        """Move the clock to `t` without running any step (a wedged engine); work resumes afterwards."""
        self.frozen = True
        if t <= self.now:
            return
        shift = t - self.now
        self.now = t
        if self.next_step_at is not None:
            self.next_step_at += shift
        if self.next_idle_log_at is not None:
            self.next_idle_log_at += shift

    def advance_to(self, t: float) -> int:
        """Run every step (and idle stats log) due up to time `t`; return the number of steps run."""
        self.frozen = False
        while self.pending_aborts:
            self.abort(self.pending_aborts.pop(0))
        steps = 0
        while True:
            step_due = self.next_step_at if self.next_step_at is not None and self.next_step_at <= t else None
            log_due = (
                self.next_idle_log_at
                if self.next_idle_log_at is not None and self.next_idle_log_at <= t
                else None
            )
            if step_due is None and log_due is None:
                break
            if log_due is not None and (step_due is None or log_due < step_due):
                self.now = log_due
                if self.in_flight == 0:
                    self.stats.iteration_tokens.observe(0)
                self.next_idle_log_at = log_due + self.idle_log_seconds
                continue
            assert step_due is not None
            self.now = step_due
            self._step()
            steps += 1
            self.next_step_at = self.now + self.step_seconds if self.in_flight else None
        self.now = max(self.now, t)
        return steps

    # ------------------------------------------------------------------ internals
    def _remove(self, req: SimRequest) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        """Make room for `tokens` KV tokens of `req`; preempt the newest others if needed."""
        need = self._blocks_for(tokens) - req.blocks
        while need > self.free_blocks:
            victim = next((r for r in reversed(self.running) if r is not req), None)
            if victim is None:
                return False
            self._preempt(victim)
        self.free_blocks -= max(need, 0)
        req.blocks += max(need, 0)
        return True

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0  # recompute: prompt and generated tokens are prefilled again
        req.recompute = req.generated
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)
        self.stats.preemptions += 1

    def _step(self) -> None:
        budget = self.chunk_tokens
        scheduled: dict[int, int] = {}  # request_id -> tokens this step
        # 1. decodes
        for req in list(self.running):
            if req not in self.running or req.in_prefill or budget <= 0:
                continue
            if self._grow(req, req.computed + 1):
                scheduled[req.request_id] = 1
                budget -= 1
        # 2. running prefills
        for req in list(self.running):
            if req not in self.running or not req.in_prefill or budget <= 0:
                continue
            chunk = min(req.prefill_remaining, budget)
            if self._grow(req, req.computed + chunk):
                scheduled[req.request_id] = chunk
                budget -= chunk
        # 3. admit waiting requests (FIFO)
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            chunk = min(req.prefill_remaining, budget)
            need = self._blocks_for(req.computed + chunk) - req.blocks
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            req.state = RequestState.RUNNING
            self.running.append(req)
            self._grow(req, req.computed + chunk)
            if req.first_scheduled is None:
                req.first_scheduled = self.now
            self.stats.prefix_cache_queries += req.prompt_tokens
            scheduled[req.request_id] = chunk
            budget -= chunk
        # 4. outputs
        prompt_credit = 0
        prefill_computed = 0
        emitted = 0
        finished: list[SimRequest] = []
        for req in list(self.running):
            tokens = scheduled.get(req.request_id)
            if tokens is None:
                continue
            if req.in_prefill:
                req.computed += tokens
                prefill_computed += tokens
                if req.in_prefill:
                    continue  # partial chunk: no output this step
                if req.first_token_time is None:
                    req.first_token_time = self.now
                    prompt_credit += req.prompt_tokens
                    self.stats.ttft.observe(self.now - req.arrival)
                    began = req.first_scheduled if req.first_scheduled is not None else req.arrival
                    self.stats.prefill_time.observe(self.now - began)
                    if self.flavour == "llamacpp":
                        began = req.first_scheduled if req.first_scheduled is not None else req.arrival
                        spent = self.now - began + self.step_seconds  # the step that finished the prompt counts
                        self.stats.prompt_seconds += spent
                        self.stats.window_prompt_tokens += req.prompt_tokens
                        self.stats.window_prompt_seconds += spent
            else:
                req.computed += 1  # the KV of the token sampled last step
                if req.last_token_time is not None:
                    self.stats.inter_token.observe(self.now - req.last_token_time)
            req.last_token_time = self.now
            req.generated += 1
            emitted += 1
            if req.generated >= req.max_tokens:
                finished.append(req)
        for req in finished:
            self._remove(req)
            req.state = RequestState.FINISHED
            req.finished_reason = "length"
            req.finish_time = self.now
            self.stats.request_success["length"] = self.stats.request_success.get("length", 0) + 1
            self.stats.e2e.observe(self.now - req.arrival)
            self.stats.finished += 1
            if self.flavour == "llamacpp":
                self._credit_predicted(req)
        # 5. stats
        st = self.stats
        st.steps += 1
        st.generation_tokens += emitted
        if self.flavour == "v0":
            st.prompt_tokens += prefill_computed
            st.iteration_tokens.observe(prefill_computed + emitted)
        else:
            st.prompt_tokens += prompt_credit
            if emitted:
                st.iteration_tokens.observe(prompt_credit + emitted)
        if self.flavour == "llamacpp":
            st.busy_slot_decodes += len(scheduled)
            longest = max((r.computed for r in self.running), default=0)
            longest = max([longest, *(r.prompt_tokens + r.generated for r in finished)])
            st.n_tokens_max = max(st.n_tokens_max, longest)
        prefill_batch = prefill_computed > 0
        if self.flavour == "sglang":
            if prefill_batch:
                st.prefill_passes += 1
            else:
                st.decode_passes += 1
                st.decode_since_log += 1
        self._publish_gauges(force=prefill_batch or self.in_flight == 0)

    def _publish_gauges(self, *, force: bool) -> None:
        """The stat logger publishes running / waiting / KV usage. SGLang only on prefill batches, every
        `decode_log_interval` decode batches and when idle; the others after every step."""
        st = self.stats
        if self.flavour == "sglang" and not force and st.decode_since_log < self.decode_log_interval:
            return
        st.decode_since_log = 0
        st.running = len(self.running)
        st.waiting = len(self.waiting)
        st.kv_usage = self.kv_usage

    def _credit_predicted(self, req: SimRequest) -> None:
        """llama-server adds a request's generated tokens to tokens_predicted_total when it finishes."""
        st = self.stats
        st.tokens_predicted += req.generated
        spent = max(self.now - (req.first_token_time if req.first_token_time is not None else self.now), 0.0)
        st.predicted_seconds += spent
        st.window_predicted_tokens += req.generated
        st.window_predicted_seconds += spent
