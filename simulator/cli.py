"""`llm-health sim`: run a simulated vLLM OpenAI-compatible server (fire drills, tests)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from llm_health.simulator.server import SimConfig, Simulator


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8000, help="main port (0 = any free port; default 8000)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--control-port", type=int, default=None,
                        help="second listener serving only /sim/fault and /sim/stats; survives crash and hang")
    parser.add_argument("--model", default="sim-model", help="served model name (default sim-model)")
    parser.add_argument("--engine", choices=("v0", "v1", "sglang", "llamacpp"), default="v1",
                        help="engine flavour: v1 (vLLM 0.11+, default), v0 (old vLLM engine), sglang (0.5.x) "
                             "or llamacpp (llama-server b11434)")
    parser.add_argument("--tp-size", type=int, default=1,
                        help="sglang: tensor-parallel ranks exporting the scheduler series (default 1)")
    parser.add_argument("--load-seconds", type=float, default=0.0,
                        help="sglang/llamacpp: answer 503 (llama.cpp: 'Loading model') this long after each "
                             "start (engine seconds; default 0)")
    parser.add_argument("--engines", type=int, default=1, help="data-parallel engines (engine label 0..N-1)")
    parser.add_argument("--multiprocess", action="store_true",
                        help="multiprocess-mode page: no process_*, python_*, *_created")
    parser.add_argument("--no-metrics", action="store_true", help="answer /metrics with 404")
    parser.add_argument("--max-num-seqs", type=int, default=12, help="max running requests per engine (default 12)")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="engine step duration (default 0.05)")
    parser.add_argument("--chunk-tokens", type=int, default=512, help="token budget per step (chunked prefill)")
    parser.add_argument("--kv-blocks", type=int, default=2048, help="KV cache blocks per engine (default 2048)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="use this prompt length for every request instead of estimating it")
    parser.add_argument("--restart-seconds", type=float, default=1.0,
                        help="downtime of a restart fault (default 1, engine seconds)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="engine seconds per real second: divides step time, idle log period, "
                             "restart downtime and fault durations (default 1)")
    parser.add_argument("--idle-log-seconds", type=float, default=10.0,
                        help="v0: idle stats-log period that observes iteration_tokens 0 (default 10)")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        host=args.host,
        port=args.port,
        control_port=args.control_port,
        model=args.model,
        engine=args.engine,
        engines=args.engines,
        multiprocess=args.multiprocess,
        no_metrics=args.no_metrics,
        max_num_seqs=args.max_num_seqs,
        step_seconds=args.step_seconds,
        chunk_tokens=args.chunk_tokens,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        prompt_tokens=args.prompt_tokens,
        restart_seconds=args.restart_seconds,
        time_scale=args.time_scale,
        idle_log_seconds=args.idle_log_seconds,
        tp_size=args.tp_size,
        load_seconds=args.load_seconds,
    )


def run(args: argparse.Namespace) -> int:
    # The handlers come before the listener: a SIGTERM that arrives as soon as /health answers must stop
    # the simulator cleanly (exit 0), not kill it with the default action.
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sim = Simulator(config_from_args(args))
        sim.start()
    except ValueError as exc:
        print(f"llm-health sim: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"llm-health sim: cannot listen: {exc}", file=sys.stderr)
        return 1
    line = f"llm-health sim: serving {sim.url} (engine {args.engine}, model {args.model})"
    if sim.control_url:
        line += f" control {sim.control_url}"
    print(line, flush=True)
    try:
        done.wait()
    finally:
        sim.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_health.simulator", description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))
