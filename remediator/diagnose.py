"""`llm-health diagnose`: the shipped diagnostics recipe, what a stuck engine shows before it is killed.

    llm-health diagnose [--url URL] [--out DIR] [--match REGEX | --pid PID ...] [--log-command ARGV ...]

Run by the remediator right before the restart of a backend verified stalled or unresponsive
(`remediator.diagnostics: [llm-health, diagnose]`; remediator/diagnostics.py bounds it and stores what it
prints with the incident). It prints, section by section, each with its own deadline:

* the engine's `/health` answer and two `/metrics` pages a second apart (their in-flight, KV and token
  lines; the whole pages go to `--out`, default $LLM_HEALTH_DIAG_DIR, when there is one);
* `py-spy dump` of every process whose command line matches `--match` (default: vLLM, SGLang, llama.cpp
  and vLLM's EngineCore) or of the `--pid`s: the Python stacks of the engine threads, the evidence a
  restart wipes. Without the right to trace (EPERM) it says how to grant it (SYS_PTRACE);
* the output of `--log-command` (e.g. `journalctl -u vllm@gpu-a -n 200 --no-pager`), if given.

`--url` defaults to $LLM_HEALTH_URL. The processes are looked for on this host only: run it where the
engine runs (the same host, the same pod with a shared process namespace, or through ssh in the argv).
Exit 0 when it could say something; it never changes anything.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from pathlib import Path

from llm_health.http_client import HttpFailure, fetch
from llm_health.remediator.diagnostics import PTRACE_HINT, capture, ptrace_refused
from llm_health.remediator.store.rows import CaptureResult

DEFAULT_MATCH = r"vllm|sglang|llama-server|EngineCore"
STEP_MAX_BYTES = 1 << 20       # one step's output (the remediator keeps diagnostics_max_bytes of the whole)
KEPT_LINE = re.compile(r"^(vllm|sglang|llamacpp):\S*(running|waiting|kv_cache|cache_usage|tokens_total|"
                       r"queue|processing|deferred)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("LLM_HEALTH_URL", ""), help="the engine's URL "
                        "(default $LLM_HEALTH_URL)")
    parser.add_argument("--out", default=os.environ.get("LLM_HEALTH_DIAG_DIR", ""),
                        help="folder for the whole pages (default $LLM_HEALTH_DIAG_DIR; none: not kept)")
    parser.add_argument("--match", default=DEFAULT_MATCH, help=f"processes to dump (regex; default {DEFAULT_MATCH})")
    parser.add_argument("--pid", type=int, action="append", default=[], help="dump this process (repeatable)")
    parser.add_argument("--log-command", nargs=argparse.REMAINDER, default=[],
                        help="an argv whose output is the log tail (last option: takes the rest)")
    parser.add_argument("--timeout", type=float, default=8.0, help="seconds for each step (default 8)")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "", help="py-spy's path (default: PATH)")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if args.url:
        section(f"/health of {args.url}")
        print(health(args.url, args.timeout))
        for n in (1, 2):
            if n == 2:
                time.sleep(1.0)       # two pages a second apart: did anything move?
            section(f"/metrics page {n}")
            print(metrics_page(args.url, args.timeout, out / f"metrics-{n}.txt" if out else None))
    pids = args.pid or matching_pids(args.match)
    section(f"py-spy dump of {len(pids)} process(es)")
    for pid in pids:
        print(f"--- pid {pid}: {cmdline(pid)[:200]}")
        print(py_spy(args.py_spy, pid, args.timeout))
    if args.log_command:
        section(f"log tail: {' '.join(args.log_command)[:200]}")
        print(run_bounded(args.log_command, args.timeout))
    return 0


def section(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def health(url: str, timeout: float) -> str:
    try:
        resp = fetch("GET", url.rstrip("/") + "/health", timeout=timeout, max_bytes=4096)
    except HttpFailure as exc:
        return f"no answer: {exc.kind.value}: {exc.detail}"
    return f"HTTP {resp.status} in {resp.seconds:.2f}s: {resp.text[:300]!r}"


def metrics_page(url: str, timeout: float, keep: Path | None) -> str:
    try:
        resp = fetch("GET", url.rstrip("/") + "/metrics", timeout=timeout)
    except HttpFailure as exc:
        return f"no answer: {exc.kind.value}: {exc.detail}"
    text = resp.text
    if keep is not None:
        try:
            keep.write_text(text)
        except OSError as exc:
            text_note = f" (not kept: {exc.strerror})"
        else:
            text_note = f" (kept in {keep})"
    else:
        text_note = ""
    lines = [ln for ln in text.splitlines() if KEPT_LINE.match(ln)][:60]
    return f"HTTP {resp.status}, {len(resp.body)} bytes in {resp.seconds:.2f}s{text_note}\n" + "\n".join(lines)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def matching_pids(pattern: str) -> list[int]:
    """This host's processes whose command line matches (never this process, nor its parents)."""
    rx = re.compile(pattern)
    ours = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in ours:
            line = cmdline(int(entry.name))
            if line != "?" and rx.search(line) and "diagnose" not in line:
                found.append(int(entry.name))
    return sorted(found)[:32]


def py_spy(binary: str, pid: int, timeout: float) -> str:
    if not binary:
        return "py-spy is not installed here (pip install py-spy): no stacks"
    text = run_bounded([binary, "dump", "--pid", str(pid)], timeout)
    if ptrace_refused(text):
        text += f"\n{PTRACE_HINT}"
    return text


def run_bounded(argv: list[str], timeout: float) -> str:
    """One step's argv, stdout and stderr together, bounded like the whole capture (diagnostics.capture)."""
    got = capture(argv, {}, timeout, STEP_MAX_BYTES)
    failed = got.result == CaptureResult.FAILED and got.exit_code is not None
    return got.output.rstrip() + (f"\n[exit {got.exit_code}]" if failed else "")
