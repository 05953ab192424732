"""`llm-health` console command: one entry point, one module per subcommand.

Each subcommand module offers `configure(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llm_health import __version__
from llm_health.config import ConfigError

COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("llm_health.simulator.cli", "run a simulated vLLM server (fire drills, tests)"),
    "exporter": ("llm_health.exporter.cli", "read backends' /metrics, judge them, probe only idle ones"),
    "check": ("llm_health.exporter.check", "one-shot verdict for one server (exit 0 ok, 1 unknown, 2 stalled/down)"),
    "remediator": ("llm_health.remediator.cli", "Alertmanager webhook receiver: the one restart authority"),
    "busy": ("llm_health.remediator.busy", "run a batch job with a busy marker set for a backend"),
    "token": ("llm_health.remediator.token", "write a random bearer token file for the remediator (once)"),
    "rules": ("llm_health.rules", "render the Prometheus rules from their templates"),
    "demo": ("llm_health.demo", "run the whole pipeline on loopback with simulated backends"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-health", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"llm-health {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"llm-health {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
