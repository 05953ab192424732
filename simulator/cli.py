"""Placeholder: replaced by the issue that builds this subcommand."""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER)


def run(args: argparse.Namespace) -> int:
    print("not built yet", file=sys.stderr)
    return 2
