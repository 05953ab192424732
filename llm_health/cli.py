"""`llm-health` console command: one entry point, one module per subcommand.

Each subcommand module offers `configure(parser)` and `run(args) -> int`. Only the module of the
subcommand being run is imported: `llm-health --version`, `--help` and `rules render` do not load the
web stack (flask, gunicorn, requests, prometheus_client); tests/process/test_cli_lazy.py holds that.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llm_health import __version__
from llm_health.assets import AssetError
from llm_health.config import ConfigError
from llm_health.redact import redact

COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("llm_health.simulator.cli", "run a simulated vLLM server (fire drills, tests)"),
    "exporter": ("llm_health.exporter.cli", "read backends' /metrics, judge them, probe only idle ones"),
    "check": ("llm_health.exporter.check", "one-shot verdict for one server (exit 0 ok, 1 unknown, 2 stalled/down)"),
    "remediator": ("llm_health.remediator.cli", "Alertmanager webhook receiver: the one restart authority"),
    "ctl": ("llm_health.remediator.ctl", "operator commands to a running remediator: status, drain, undrain, retire, "
            "activate, restart, diagnostics"),
    "diagnose": ("llm_health.remediator.diagnose", "what a stuck engine shows (/health, /metrics, py-spy stacks, a "
                 "log tail): the recipe the remediator runs before a kill"),
    "readiness": ("llm_health.remediator.sidecar.cli", "readiness sidecar of a vLLM pod: /ready follows the "
                  "remediator's lifecycle (Kubernetes), the engine's /health when the remediator is away"),
    "busy": ("llm_health.remediator.busy", "run a batch job with a busy marker set for a backend"),
    "token": ("llm_health.remediator.token", "write a random bearer token file for the remediator (once)"),
    "rules": ("llm_health.render.rules", "render the Prometheus rules from their templates"),
    "dashboards": ("llm_health.render.dashboards", "render the Grafana dashboards with the rule settings"),
    "healthcheck": ("llm_health.healthcheck", "exit 0 when a URL answers 2xx (container HEALTHCHECK of our own parts)"),
    "demo": ("llm_health.drill.demo", "run the whole pipeline on loopback with simulated backends"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, the subcommand modules other than `only` are not imported (their
    subparsers exist for --help but take no options)."""
    parser = argparse.ArgumentParser(prog="llm-health", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"llm-health {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is not None and name != only:
            continue
        mod = importlib.import_module(module)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def command_of(argv: list[str]) -> str:
    """The subcommand named in argv (the first word that is not an option), or "" when there is none."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=command_of(argv))
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ConfigError, AssetError) as exc:
        print(redact(f"llm-health {args.command}: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
