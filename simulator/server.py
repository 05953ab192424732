"""The simulated vLLM HTTP server: OpenAI-compatible endpoints, /metrics, fault injection, stats.

`Simulator` owns one simulated vLLM *process* (`SimProcess`: engines, start time) at a time and
replaces it on a restart fault; the statistics in `/sim/stats` belong to the simulator and survive.
A driver thread advances the engines with real time multiplied by `time_scale`.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from llm_health.httpserver import QuietHandler
from llm_health.simulator.engine import Engine, RequestState, SimRequest
from llm_health.simulator.metrics import ENGINES, Flavour, http_handler, http_status, render

FAULTS = ("none", "stall", "wedge", "hang", "crash", "restart", "slow_metrics", "error")
ERROR_MESSAGE = "simulated engine error: the request failed"
PROBE_HEADER = "X-LLM-Health-Probe"
VERSIONS = {"v0": "0.6.6.post1", "v1": "0.11.2", "sglang": "0.5.3", "llamacpp": "b11434"}
LLAMACPP_START_HEADER = "Process-Start-Time-Unix"  # llama-server: in fact monotonic microseconds since boot
SGLANG_HEALTH_TIMEOUT = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT: /health waits this long for any engine output
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
VERSION_MAX_CHARS = 64
RESTART_SETTINGS = ("step_seconds", "version")  # what a restart may change for the new process


def check_step_seconds(value: Any) -> float:
    """A positive finite number of engine seconds per step; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"step_seconds must be a positive finite number; got {value!r}")
    return float(value)


def check_version(value: Any) -> str:
    """A short printable version string (1 to VERSION_MAX_CHARS characters); ValueError otherwise."""
    if not isinstance(value, str) or not value or len(value) > VERSION_MAX_CHARS or not value.isprintable():
        raise ValueError(f"version must be a printable string of 1 to {VERSION_MAX_CHARS} characters; got {value!r}")
    return value


class BadRequest(ValueError):
    """Client input that is refused with a 400 and changes nothing."""


class FaultConflict(RuntimeError):
    """A fault that cannot apply in the current state (409, changes nothing)."""


@dataclass
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 0
    control_port: int | None = None
    model: str = "sim-model"
    engine: str = "v1"
    engines: int = 1
    multiprocess: bool = False
    no_metrics: bool = False
    max_num_seqs: int = 12
    step_seconds: float = 0.05
    chunk_tokens: int = 512
    kv_blocks: int = 2048
    block_size: int = 16
    prompt_tokens: int | None = None
    restart_seconds: float = 1.0
    time_scale: float = 1.0
    idle_log_seconds: float = 10.0
    tp_size: int = 1             # sglang: tensor-parallel ranks exporting the scheduler series
    load_seconds: float = 0.0    # sglang / llamacpp: answer 503 while "loading the model" after each start
    version: str | None = None   # what /version answers (None: the engine's default, VERSIONS)

    def validate(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}")
        if self.engines < 1:
            raise ValueError("--engines must be at least 1")
        if self.engine in ("v0", "llamacpp") and self.engines > 1:
            raise ValueError(f"--engine {self.engine} has no engine label: use --engines 1")
        if self.tp_size < 1 or (self.tp_size > 1 and self.engine != "sglang"):
            raise ValueError("--tp-size must be at least 1, and above 1 only with --engine sglang")
        if self.load_seconds < 0:
            raise ValueError("--load-seconds must be >= 0")
        if self.load_seconds > 0 and self.engine in ("v0", "v1"):
            raise ValueError("--load-seconds is for sglang/llamacpp (a loading vLLM refuses connections: "
                             "use --restart-seconds)")
        if self.time_scale <= 0:
            raise ValueError("--time-scale must be positive")
        if self.restart_seconds < 0:
            raise ValueError("--restart-seconds must be >= 0")
        if self.prompt_tokens is not None and self.prompt_tokens < 1:
            raise ValueError("--prompt-tokens must be at least 1")
        for name in ("max_num_seqs", "chunk_tokens", "kv_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.step_seconds <= 0:
            raise ValueError("--step-seconds must be positive")
        if self.version is not None:
            check_version(self.version)

    @property
    def effective_version(self) -> str:
        return self.version if self.version is not None else VERSIONS[self.engine]


class SimProcess:
    """One life of the simulated vLLM process: its engines, clock origin, start time and the API server's
    HTTP request counts (http_requests_total: a new process starts from zero)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.start_time = time.time()
        self.boot_micros = int(self.t0 * 1e6)  # llama-server's Process-Start-Time-Unix header
        self.ready_at = self.t0 + cfg.load_seconds / cfg.time_scale
        self.engines = [
            Engine(
                max_num_seqs=cfg.max_num_seqs,
                step_seconds=cfg.step_seconds,
                chunk_tokens=cfg.chunk_tokens,
                kv_blocks=cfg.kv_blocks,
                block_size=cfg.block_size,
                flavour=cfg.engine,
                idle_log_seconds=cfg.idle_log_seconds,
                index=i,
            )
            for i in range(cfg.engines)
        ]
        self.created = self.start_time + 0.5  # metric objects are created after start-up work
        self.dead: str | None = None  # "crash" / "restart" once this life is over
        self._rr = itertools.cycle(self.engines)
        # (handler, method, grouped status) -> (count, time the labelled child was created)
        self.http_requests: dict[tuple[str, str, str], tuple[int, float]] = {}

    def count_http(self, handler: str, method: str, status: int) -> None:
        """One answered request (the caller holds the simulator's lock)."""
        key = (handler, method, http_status(status))
        n, created = self.http_requests.get(key, (0, time.time()))
        self.http_requests[key] = (n + 1, created)

    def engine_time(self) -> float:
        return (time.monotonic() - self.t0) * self.cfg.time_scale

    @property
    def loading(self) -> bool:
        return time.monotonic() < self.ready_at

    def next_engine(self) -> Engine:
        return next(self._rr)

    @property
    def running(self) -> int:
        return sum(len(e.running) for e in self.engines)

    @property
    def waiting(self) -> int:
        return sum(len(e.waiting) for e in self.engines)


@dataclass
class SimStats:
    requests: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("generation", "probe", "metrics", "health", "models", "other"), 0)
    )
    probes: int = 0
    probes_while_busy: int = 0
    generation_while_busy: int = 0
    restarts: int = 0
    sleeps: int = 0
    generation_while_asleep: int = 0      # vLLM: each one crashed the engine
    probes_while_asleep: int = 0


def request_kind(method: str, path: str, probe: bool) -> str:
    if probe:
        return "probe"
    if method == "POST" and path in GENERATION_PATHS:
        return "generation"
    return {"/metrics": "metrics", "/health": "health", "/v1/models": "models"}.get(path, "other")


def approx_prompt_tokens(prompt: Any) -> int:
    """vLLM tokenises; we approximate: 1.3 tokens a word, or the length of a token-id list."""
    if isinstance(prompt, list):
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return max(len(prompt), 1)
        if all(isinstance(t, str) for t in prompt):
            return max(sum(approx_prompt_tokens(t) for t in prompt), 1)
        raise BadRequest("prompt must be a string, a list of strings or a list of token ids")
    if isinstance(prompt, str):
        return max(math.ceil(len(prompt.split()) * 1.3), 1)
    raise BadRequest("prompt must be a string, a list of strings or a list of token ids")


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], sim: Simulator, control: bool) -> None:
        self.sim = sim
        self.control = control
        self.alive = True
        super().__init__(addr, _Handler)


class Simulator:
    """The simulated server: main listener, optional control listener, driver thread, faults."""

    def __init__(self, cfg: SimConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.cond = threading.Condition(threading.RLock())
        self.stats = SimStats()
        self.process = SimProcess(cfg)
        self.fault = "none"
        self.stalled_page: str | None = None  # llamacpp: the page while the loop is frozen inside decode
        self.slow_metrics_seconds = 3.0
        self.wedged_page = ""               # what /metrics shows while wedged (frozen at the wedge)
        self._fault_timer: threading.Timer | None = None
        self._fault_epoch = 0
        self._next_settings: dict[str, Any] = {}  # restart settings for the next process (RESTART_SETTINGS)
        self.main: _Listener | None = None
        self.control: _Listener | None = None
        self.port = cfg.port
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    @property
    def control_url(self) -> str | None:
        return f"http://{self.cfg.host}:{self.control.server_address[1]}" if self.control else None

    def start(self) -> Simulator:
        # the control port is bound before the main port answers: whoever waits for the main port (a test's
        # fixture, a drill) may use the control port at once (its connections wait in the backlog until served)
        if self.cfg.control_port is not None:
            self.control = _Listener((self.cfg.host, self.cfg.control_port), self, control=True)
        self._open_main()
        if self.control is not None:
            self._spawn(lambda: self.control.serve_forever(poll_interval=0.05), "sim-control")
        self._spawn(self._drive, "sim-driver")
        return self

    def stop(self) -> None:
        with self.cond:
            self._stopping.set()
            self._cancel_fault_timer()
            self.process.dead = "stop"
            for e in self.process.engines:
                e.fail_all("server stopped")
            self.cond.notify_all()
        self._close_main()
        if self.control is not None:
            self.control.alive = False
            self.control.shutdown()
            self.control.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _open_main(self) -> None:
        listener = _Listener((self.cfg.host, self.port), self, control=False)
        self.port = listener.server_address[1]
        self.main = listener
        threading.Thread(
            target=listener.serve_forever, kwargs={"poll_interval": 0.05}, name="sim-main", daemon=True
        ).start()

    def _close_main(self) -> None:
        listener, self.main = self.main, None
        if listener is None:
            return
        listener.alive = False
        with self.cond:
            self.cond.notify_all()
        listener.shutdown()
        listener.server_close()

    # ------------------------------------------------------------------ engine driver
    def _drive(self) -> None:
        while not self._stopping.is_set():
            with self.cond:
                proc = self.process
                if proc.dead is None:
                    now = proc.engine_time()
                    for e in proc.engines:
                        if self.fault in ("stall", "wedge"):
                            e.freeze_until(now)
                        else:
                            e.advance_to(now)
                    self.cond.notify_all()
            real_step = self.cfg.step_seconds / self.cfg.time_scale
            time.sleep(min(max(real_step / 4, 0.001), 0.01))

    # ------------------------------------------------------------------ faults
    def _cancel_fault_timer(self) -> None:
        self._fault_epoch += 1
        if self._fault_timer is not None:
            self._fault_timer.cancel()
            self._fault_timer = None

    def _after(self, real_seconds: float, action: Callable[[], None]) -> None:
        epoch = self._fault_epoch

        def fire() -> None:
            with self.cond:
                if epoch != self._fault_epoch or self._stopping.is_set():
                    return
            action()

        self._fault_timer = threading.Timer(real_seconds, fire)
        self._fault_timer.daemon = True
        self._fault_timer.start()

    def set_fault(self, name: str, seconds: float | None = None, *, step_seconds: float | None = None,
                  version: str | None = None) -> dict[str, Any]:
        """Apply a fault (already validated); slow parts run in the background.

        `seconds`: for stall/wedge/hang, clear the fault after that long; for crash, restart after that
        long; for restart, the downtime (default --restart-seconds); for slow_metrics, the delay.
        All are engine seconds (divided by --time-scale). Raises FaultConflict when the main
        port is down and the fault needs it up.

        `step_seconds` and `version` (restart only): the new process runs with that step time and answers
        that version, and so does every later one until a restart sets them again (a deployed new
        version). A restart already in progress takes them for the process it is about to start.
        Raises BadRequest (nothing changed) for a bad value or for these settings on another fault.
        """
        settings: dict[str, Any] = {}
        try:
            if step_seconds is not None:
                settings["step_seconds"] = check_step_seconds(step_seconds)
            if version is not None:
                settings["version"] = check_version(version)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if settings and name != "restart":
            raise BadRequest(f"{', '.join(settings)} only apply to the restart fault, not {name!r}")
        with self.cond:
            previous = self.fault
            scaled = None if seconds is None else seconds / self.cfg.time_scale
            down = previous in ("crash", "restart")
            if name == "restart" and previous == "restart":
                self._next_settings.update(settings)  # the process about to start takes them
                return self._fault_answer(previous)  # already restarting
            if down and name not in ("none", "restart"):
                raise FaultConflict(f"the main port is down ({previous}); send restart or none first")
            self._cancel_fault_timer()
            if name == "restart" or (name == "none" and previous == "crash"):
                if name == "restart":
                    downtime = scaled if scaled is not None else self.cfg.restart_seconds / self.cfg.time_scale
                else:
                    downtime = 0.0
                self.fault = "restart"
                self._next_settings.update(settings)
                if self.main is not None:
                    self.main.alive = False
                self._kill_process("restart")
                self._spawn(lambda: self._restart(downtime), "sim-restart")
            elif name == "none" and previous == "restart":
                pass  # the restart in progress ends with fault none
            elif name == "crash":
                self.fault = "crash"
                if self.main is not None:
                    self.main.alive = False
                self._kill_process("crash")
                self._spawn(self._close_main, "sim-crash")
                if scaled is not None:
                    self._after(scaled, lambda: self.set_fault("restart", 0.0))
            elif name in ("stall", "wedge", "hang"):
                if name == "stall" and previous != "stall":
                    self.stalled_page = self._stall_snapshot()
                if name == "wedge" and previous != "wedge":
                    self.wedged_page = self.metrics_page()  # the page as the engine last updated it
                self.fault = name
                if scaled is not None:
                    self._after(scaled, lambda: self.set_fault("none"))
            elif name == "slow_metrics":
                self.fault = name
                self.slow_metrics_seconds = 3.0 if seconds is None else seconds
            elif name == "error":
                self.fault = name
                if scaled is not None:
                    self._after(scaled, lambda: self.set_fault("none"))
            else:
                self.fault = "none"
            self.cond.notify_all()
            return self._fault_answer(previous)

    def _stall_snapshot(self) -> str | None:
        """llama.cpp: a loop frozen inside decode (work in flight) leaves a helper answering /metrics with
        the page as it was; frozen outside decode or while idle, /metrics hangs (None)."""
        if self.cfg.engine != "llamacpp" or self.process.dead is not None:
            return None
        proc = self.process
        if proc.running + proc.waiting == 0:
            return None
        return render(proc.engines, self._flavour(), process_start_time=proc.start_time, created=proc.created,
                      http_requests=proc.http_requests)

    def _flavour(self) -> Flavour:
        return Flavour(engine=self.cfg.engine, multiprocess=self.cfg.multiprocess, model=self.cfg.model,
                       tp_size=self.cfg.tp_size)

    def wait_while_stalled(self, listener: _Listener, limit: float | None = None) -> bool:
        """Block while the engine is stalled (at most `limit` real seconds); True if still stalled."""
        deadline = None if limit is None else time.monotonic() + limit
        with self.cond:
            while self.fault == "stall" and listener.alive and not self._stopping.is_set():
                left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if left <= 0:
                    break
                self.cond.wait(left)
            return self.fault == "stall"

    def _fault_answer(self, previous: str) -> dict[str, Any]:
        return {"fault": self.fault, "previous": previous, "restarts": self.stats.restarts}

    def _kill_process(self, reason: str) -> None:
        proc = self.process
        if proc.dead is None:
            proc.dead = reason
            for e in proc.engines:
                e.fail_all(reason)

    def _restart(self, downtime: float) -> None:
        with self.cond:
            self._kill_process("restart")
            self.cond.notify_all()
        self._close_main()
        if downtime > 0:
            self._stopping.wait(downtime)
        if self._stopping.is_set():
            return
        with self.cond:
            if self._next_settings:
                # a new command: this process and the later ones run with it (replace, never mutate: the
                # dying process keeps the config it was started with)
                self.cfg = replace(self.cfg, **self._next_settings)
                self._next_settings = {}
            self.process = SimProcess(self.cfg)
            self.stats.restarts += 1
            self.fault = "none"
            self.cond.notify_all()
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.cond:
                    if self._stopping.is_set():
                        return
                    self._open_main()
                return
            except OSError:
                if time.monotonic() > deadline or self._stopping.is_set():
                    raise
                time.sleep(0.05)

    # ------------------------------------------------------------------ requests
    def record_arrival(self, method: str, path: str, probe: bool) -> None:
        with self.cond:
            st = self.stats
            key = f"{method} {path}"
            st.requests[key] = st.requests.get(key, 0) + 1
            kind = request_kind(method, path, probe)
            st.by_kind[kind] += 1
            busy = self.process.running + self.process.waiting > 0 and self.process.dead is None
            if probe:
                st.probes += 1
                if busy:
                    st.probes_while_busy += 1
                if self.asleep and self.process.dead is None:
                    st.probes_while_asleep += 1
            elif kind == "generation" and busy:
                st.generation_while_busy += 1

    def wait_while_hung(self, listener: _Listener) -> bool:
        """Block while the main port hangs; False if the listener died meanwhile (drop the connection)."""
        with self.cond:
            while self.fault == "hang" and listener.alive and not self._stopping.is_set():
                self.cond.wait(0.2)
            return listener.alive

    def submit(self, prompt_tokens: int, max_tokens: int) -> tuple[SimProcess, SimRequest]:
        if self.cfg.prompt_tokens is not None:
            prompt_tokens = self.cfg.prompt_tokens
        with self.cond:
            proc = self.process
            engine = proc.next_engine()
            if self.fault in ("stall", "wedge"):
                engine.freeze_until(proc.engine_time())
            else:
                engine.advance_to(proc.engine_time())
            try:
                req = engine.submit(prompt_tokens, max_tokens)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            self.cond.notify_all()
            return proc, req

    def wait_tokens(self, req: SimRequest, seen: int, timeout: float = 0.5) -> None:
        with self.cond:
            if req.generated == seen and not req.done:
                self.cond.wait(timeout)

    def abort(self, proc: SimProcess, req: SimRequest) -> None:
        with self.cond:
            for e in proc.engines:
                if req in e.running or req in e.waiting:
                    e.abort(req)

    # ------------------------------------------------------------------ sleep mode
    @property
    def asleep(self) -> bool:
        return any(e.sleep_level for e in self.process.engines)

    def sleep(self, level: int) -> None:
        """vLLM's POST /sleep?level=N (dev mode), llama.cpp's --sleep-idle-seconds: the engine sleeps."""
        with self.cond:
            for e in self.process.engines:
                e.sleep_level = level
            self.stats.sleeps += 1
            self.cond.notify_all()

    def wake_up(self) -> None:
        with self.cond:
            for e in self.process.engines:
                e.sleep_level = 0
            self.cond.notify_all()

    @property
    def version(self) -> str:
        """What /version answers: the restart's `version`, else the engine's default."""
        return self.cfg.effective_version

    def metrics_page(self) -> str:
        with self.cond:
            proc = self.process
            return render(proc.engines, self._flavour(), process_start_time=proc.start_time, created=proc.created,
                          http_requests=proc.http_requests)

    def count_http(self, proc: SimProcess, handler: str, method: str, status: int) -> None:
        with self.cond:
            proc.count_http(handler, method, status)

    def stats_json(self) -> dict[str, Any]:
        with self.cond:
            st = self.stats
            return {
                "requests": dict(st.requests),
                "by_kind": dict(st.by_kind),
                "probes": st.probes,
                "probes_while_busy": st.probes_while_busy,
                "probes_while_asleep": st.probes_while_asleep,
                "generation_while_asleep": st.generation_while_asleep,
                "asleep": self.asleep,
                "sleeps": st.sleeps,
                "generation_while_busy": st.generation_while_busy,
                "running": self.process.running if self.process.dead is None else 0,
                "waiting": self.process.waiting if self.process.dead is None else 0,
                "fault": self.fault,
                "restarts": st.restarts,
                "process_start_time": self.process.start_time,
                "engine": self.cfg.engine,
                "step_seconds": self.cfg.step_seconds,
                "version": self.version,
                "loading": self.process.loading,
                "url": self.url,
                "port_open": self.main is not None,
            }


def parse_fault(body: Any) -> tuple[str, float | None, dict[str, Any]]:
    """(fault, seconds, restart settings) of a POST /sim/fault body; BadRequest if malformed.

    The settings (`step_seconds`, `version`; only with "restart") are the keyword arguments of set_fault."""
    if not isinstance(body, dict):
        raise BadRequest('body must be a JSON object like {"fault": "stall", "seconds": 5}')
    allowed = ("fault", "seconds", *RESTART_SETTINGS)
    unknown = set(body) - set(allowed)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))} (allowed: {', '.join(allowed)})")
    name = body.get("fault")
    if not isinstance(name, str) or name not in FAULTS:
        raise BadRequest(f"fault must be one of {', '.join(FAULTS)}; got {name!r}")
    seconds = body.get("seconds")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise BadRequest(f"seconds must be a number; got {seconds!r}")
        if seconds < 0:
            raise BadRequest(f"seconds must be >= 0; got {seconds!r}")
        seconds = float(seconds)
    settings: dict[str, Any] = {}
    try:
        if body.get("step_seconds") is not None:
            settings["step_seconds"] = check_step_seconds(body["step_seconds"])
        if body.get("version") is not None:
            settings["version"] = check_version(body["version"])
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if settings and name != "restart":
        raise BadRequest(f"{', '.join(settings)} only apply to the restart fault, not {name!r}")
    return name, seconds, settings


def parse_generation(path: str, body: Any, model: str) -> tuple[Any, int, bool]:
    """(prompt, max_tokens, stream) of a completion request; BadRequest if malformed."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    requested = body.get("model")
    if requested is not None and requested != model:
        raise LookupError(f"The model `{requested}` does not exist.")
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        words: list[str] = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest("each message must be an object with a role and content")
            content = m.get("content", "")
            if isinstance(content, str):
                words.append(content)
            elif isinstance(content, list):
                words.extend(str(part.get("text", "")) for part in content if isinstance(part, dict))
            elif content is not None:
                raise BadRequest("message content must be a string or a list of parts")
        prompt: Any = " ".join(["<|im_start|>", *words])
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required")
        prompt = body["prompt"]
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if max_tokens is None:
        max_tokens = 16
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be a positive integer; got {max_tokens!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be a boolean; got {stream!r}")
    return prompt, max_tokens, stream


def token_text(i: int) -> str:
    return f" tok{i}"


class _Handler(QuietHandler):
    server: _Listener
    server_version = "uvicorn"
    sys_version = ""
    # the process and handler label that count this request's answer in http_requests_total (None: not
    # counted: the control port, /sim/*, the excluded handlers, a request that never reached a route)
    _http: tuple[SimProcess, str] | None = None

    # ------------------------------------------------------------------ plumbing
    @property
    def sim(self) -> Simulator:
        return self.server.sim

    def _error(self, status: int, message: str) -> None:
        self.reply_json(status, {"error": message})

    def _openai_error(self, status: int, message: str, kind: str) -> None:
        self.reply_json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})

    def _read_json(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("bad Content-Length header") from None
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw:
            raise BadRequest("request body must be JSON")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"malformed JSON: {exc}") from None

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        counted, self._http = self._http, None  # once per request
        if counted is not None:
            self.sim.count_http(counted[0], counted[1], self.command, code)

    def _drop(self) -> None:
        """Close the connection without an answer (the server is gone)."""
        self.close_connection = True
        self._http = None

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # ------------------------------------------------------------------ routing
    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        self._http = None
        try:
            if path in ("/sim/fault", "/sim/stats"):
                self._sim_route(method, path)
                return
            if self.server.control:
                self.reply_json(404, {"detail": "Not Found"})
                return
            if not self.server.alive:
                self._drop()
                return
            probe = self.headers.get(PROBE_HEADER, "").strip() == "1"
            self.sim.record_arrival(method, path, probe)
            if not self.sim.wait_while_hung(self.server):
                self._drop()
                return
            self._main_route(method, path)
        except BadRequest as exc:
            self._error(400, str(exc))

    def _sim_route(self, method: str, path: str) -> None:
        if not self.server.control:
            if not self.server.alive:
                self._drop()
                return
            if not self.sim.wait_while_hung(self.server):
                self._drop()
                return
        if path == "/sim/stats":
            if method != "GET":
                self.reply_json(405, {"error": "use GET /sim/stats"})
                return
            self.reply_json(200, self.sim.stats_json())
            return
        if method != "POST":
            self.reply_json(405, {"error": 'use POST /sim/fault with {"fault": NAME, "seconds"?: n}'})
            return
        name, seconds, settings = parse_fault(self._read_json())
        try:
            answer = self.sim.set_fault(name, seconds, **settings)
        except FaultConflict as exc:
            self._error(409, str(exc))
            return
        self.reply_json(200, answer)

    def _main_route(self, method: str, path: str) -> None:
        sim = self.sim
        routes: dict[str, tuple[str, Callable[[], None]]] = {
            "/health": ("GET", self._health),
            "/ping": ("GET", self._health),
            "/version": ("GET", lambda: self.reply_json(200, {"version": sim.version})),
            "/v1/models": ("GET", self._models),
            "/metrics": ("GET", self._metrics),
            "/v1/completions": ("POST", lambda: self._generate(path)),
            "/v1/chat/completions": ("POST", lambda: self._generate(path)),
        }
        if sim.cfg.engine != "sglang":
            routes |= {"/sleep": ("POST", self._sleep), "/wake_up": ("POST", self._wake_up),
                       "/is_sleeping": ("GET", lambda: self.reply_json(200, {"is_sleeping": sim.asleep}))}
        if sim.cfg.engine == "llamacpp":
            routes["/props"] = ("GET", self._props)
        handler = http_handler(path, path in routes)
        if handler is not None:
            self._http = (sim.process, handler)  # what this process answers, 4xx and 5xx included
        route = routes.get(path)
        if route is None:
            self.reply_json(404, {"detail": "Not Found"})
        elif route[0] != method:
            self.reply_json(405, {"detail": "Method Not Allowed"})
        else:
            route[1]()

    def _sleep(self) -> None:
        query = self.path.partition("?")[2]
        level = 1
        for part in query.split("&"):
            key, _, value = part.partition("=")
            if key == "level":
                if value not in ("1", "2"):
                    raise BadRequest("level must be 1 or 2")
                level = int(value)
        self.sim.sleep(level)
        self.reply(200)

    def _wake_up(self) -> None:
        self.sim.wake_up()
        self.reply(200)

    def _props(self) -> None:
        """llama-server's /props: answered from the HTTP thread, also while asleep."""
        sim = self.sim
        cfg = sim.cfg
        self.reply_json(200, {"default_generation_settings": {"n_ctx": cfg.kv_blocks * cfg.block_size // cfg.max_num_seqs},
                              "total_slots": cfg.max_num_seqs, "is_sleeping": sim.asleep,
                              "model_alias": cfg.model, "build_info": sim.version})

    def _loading(self) -> bool:
        """sglang / llamacpp while the model loads: 503 (llama-server's "Loading model")."""
        if not self.sim.process.loading:
            return False
        if self.sim.cfg.engine == "llamacpp":
            self.reply_json(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        else:
            self.reply_json(503, {"detail": "Service Unavailable"})
        return True

    def _health(self) -> None:
        sim = self.sim
        if self._loading():
            return
        if sim.cfg.engine == "sglang":
            # SGLang's /health waits up to SGLANG_HEALTH_CHECK_TIMEOUT for any output from the engine
            if sim.wait_while_stalled(self.server, SGLANG_HEALTH_TIMEOUT / sim.cfg.time_scale):
                self.reply_json(503, {"detail": "Service Unavailable"})
                return
        # vLLM and llama.cpp answer from the HTTP thread: 200 through every engine stall
        self.reply(200)

    def _models(self) -> None:
        sim = self.sim
        card = {
            "id": sim.cfg.model,
            "object": "model",
            "created": int(sim.process.start_time),
            "owned_by": {"sglang": "sglang", "llamacpp": "llamacpp"}.get(sim.cfg.engine, "vllm"),
            "root": sim.cfg.model,
            "parent": None,
            "max_model_len": sim.cfg.kv_blocks * sim.cfg.block_size,
        }
        self.reply_json(200, {"object": "list", "data": [card]})

    def _metrics(self) -> None:
        sim = self.sim
        if sim.cfg.no_metrics:
            self.reply_json(404, {"detail": "Not Found"})
            return
        if sim.cfg.engine == "llamacpp" and self._loading():
            return
        with sim.cond:
            delay = sim.slow_metrics_seconds / sim.cfg.time_scale if sim.fault == "slow_metrics" else 0.0
        if delay > 0:
            time.sleep(delay)
        page: str | None = None
        headers: dict[str, str] = {}
        if sim.cfg.engine == "llamacpp":
            # /metrics is a task for the inference loop: frozen inside decode a helper answers with the
            # frozen page; frozen outside decode (or idle) the request waits for the loop, with no timeout.
            with sim.cond:
                stalled, page = sim.fault == "stall", sim.stalled_page
            if stalled and page is None:
                sim.wait_while_stalled(self.server)
            elif not stalled:
                page = None
            headers[LLAMACPP_START_HEADER] = str(sim.process.boot_micros)
        if not self.server.alive:
            self._drop()
            return
        if page is None:
            with sim.cond:
                page = sim.wedged_page if sim.fault == "wedge" else sim.metrics_page()
        self.reply(200, page, "text/plain; version=0.0.4; charset=utf-8", headers)

    # ------------------------------------------------------------------ generation
    def _generate(self, path: str) -> None:
        sim = self.sim
        body = self._read_json()
        try:
            prompt, max_tokens, stream = parse_generation(path, body, sim.cfg.model)
        except LookupError as exc:
            self._openai_error(404, str(exc), "NotFoundError")
            return
        if self._loading():
            return
        if sim.asleep:
            if sim.cfg.engine == "llamacpp":
                # llama-server wakes up for it: the model is loaded again (load_seconds), then it answers
                time.sleep(sim.cfg.load_seconds / sim.cfg.time_scale)
                sim.wake_up()
            else:
                # operators report a completion to a sleeping vLLM crashing the engine (vllm#15483: CUDA
                # illegal memory access): this request fails, then the process is gone
                with sim.cond:
                    sim.stats.generation_while_asleep += 1
                self._openai_error(500, "EngineCore encountered an issue: CUDA error: an illegal memory access "
                                   "was encountered (request while asleep)", "InternalServerError")
                sim.set_fault("crash")
                return
        with sim.cond:
            failing = sim.fault == "error"
        if failing:  # the engine is fine but every request fails (streaming or not): vLLM answers 500
            self._openai_error(500, ERROR_MESSAGE, "InternalServerError")
            return
        prompt_tokens = approx_prompt_tokens(prompt)
        try:
            proc, req = sim.submit(prompt_tokens, max_tokens)
        except BadRequest as exc:
            self._openai_error(400, str(exc), "BadRequestError")
            return
        chat = path == "/v1/chat/completions"
        rid = ("chatcmpl-" if chat else "cmpl-") + f"{req.request_id:032x}"
        created = int(time.time())
        if stream:
            self._stream(proc, req, rid, created, chat)
        else:
            self._complete(proc, req, rid, created, chat)

    def _complete(self, proc: SimProcess, req: SimRequest, rid: str, created: int, chat: bool) -> None:
        sim = self.sim
        while not req.done:
            sim.wait_tokens(req, req.generated)
        if req.state is RequestState.FAILED:
            if req.error == "crash":
                self._drop()  # the process vanished: no answer at all
            else:
                self._openai_error(500, f"engine failed: {req.error}", "InternalServerError")
            return
        if not sim.wait_while_hung(self.server):
            self._drop()
            return
        text = "".join(token_text(i) for i in range(req.generated))
        reason = req.finished_reason or "length"
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        self.reply_json(200, {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": sim.cfg.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": req.prompt_tokens,
                "total_tokens": req.prompt_tokens + req.generated,
                "completion_tokens": req.generated,
            },
        })

    def _stream(self, proc: SimProcess, req: SimRequest, rid: str, created: int, chat: bool) -> None:
        sim = self.sim
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None, first: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                if text is not None:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            payload = {"id": rid, "object": kind, "created": created, "model": sim.cfg.model, "choices": [choice]}
            return f"data: {json.dumps(payload)}\n\n".encode()

        sent = 0
        try:
            if chat:
                self.wfile.write(chunk(None, None, first=True))
                self.wfile.flush()
            while True:
                sim.wait_tokens(req, sent)
                if req.error == "crash":
                    return  # the process vanished: the stream just ends
                while sent < req.generated:
                    last = req.state is RequestState.FINISHED and sent == req.generated - 1
                    self.wfile.write(chunk(token_text(sent), (req.finished_reason or "length") if last else None))
                    sent += 1
                self.wfile.flush()
                if req.state is RequestState.FAILED:
                    err = {"object": "error", "message": f"engine failed: {req.error}",
                           "type": "InternalServerError", "param": None, "code": 500}
                    self.wfile.write(f"data: {json.dumps({'error': err})}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    return
                if req.state is RequestState.FINISHED:
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    return
        except (BrokenPipeError, ConnectionResetError):
            sim.abort(proc, req)
            raise
