"""Control a running simulator without a shell: a ready restart action for the remediator.

    python -m llm_health.simulator.ctl restart http://127.0.0.1:C [--seconds N] [--step-seconds X] [--version V]
    python -m llm_health.simulator.ctl fault NAME http://127.0.0.1:C [--seconds N]
    python -m llm_health.simulator.ctl stats http://127.0.0.1:C

URL is the simulator's control port (or main port). Exit 0 on a 2xx answer, 1 otherwise.
`restart --step-seconds X --version V` restarts into a changed "command": the new process (and every
later one that does not set them again) runs X engine seconds a step and answers V on /version.
"""

from __future__ import annotations

import argparse
import json
import sys

import requests

from llm_health.simulator.server import FAULTS, check_step_seconds, check_version


def _step_seconds(text: str) -> float:
    try:
        return check_step_seconds(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _version(text: str) -> str:
    try:
        return check_version(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llm_health.simulator.ctl", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout in seconds (default 5)")
    sub = parser.add_subparsers(dest="action", required=True)
    restart = sub.add_parser("restart", help="restart the simulated process (revives crash/hang)")
    restart.add_argument("url")
    restart.add_argument("--seconds", type=float, default=None, help="downtime (default: the server's)")
    restart.add_argument("--step-seconds", type=_step_seconds, default=None, dest="step_seconds",
                         help="engine seconds a step for the new process and later ones (larger: slower)")
    restart.add_argument("--version", type=_version, default=None, dest="version",
                         help="what /version answers from the new process on (default: unchanged)")
    fault = sub.add_parser("fault", help="inject a fault")
    fault.add_argument("name", choices=FAULTS)
    fault.add_argument("url")
    fault.add_argument("--seconds", type=float, default=None)
    stats = sub.add_parser("stats", help="print /sim/stats")
    stats.add_argument("url")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    base = args.url.rstrip("/")
    try:
        if args.action == "stats":
            resp = requests.get(f"{base}/sim/stats", timeout=args.timeout)
        else:
            name = "restart" if args.action == "restart" else args.name
            body: dict[str, object] = {"fault": name}
            if args.seconds is not None:
                body["seconds"] = args.seconds
            if args.action == "restart":
                for key in ("step_seconds", "version"):
                    if getattr(args, key) is not None:
                        body[key] = getattr(args, key)
            resp = requests.post(f"{base}/sim/fault", json=body, timeout=args.timeout)
    except requests.RequestException as exc:
        print(f"simulator.ctl: {args.action} {base}: {exc}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(resp.json(), indent=None if args.action != "stats" else 2))
    except ValueError:
        print(resp.text)
    return 0 if 200 <= resp.status_code < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
