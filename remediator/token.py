"""`llm-health token --out FILE [--group GID]`: write a random bearer token once.

Creates FILE (mode 600, or 640 with --group: readable by that group, e.g. Alertmanager's user in a
container) with 32 random bytes as hex, unless it already exists (then it only fixes the mode).
Used by the compose stack's token-init service; handy anywhere else too.
"""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

from llm_health.config import ConfigError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="token file to create (kept if it exists)")
    parser.add_argument("--group", type=int, help="numeric group that may read it (mode 640); default: owner only")


def run(args: argparse.Namespace) -> int:
    path: Path = args.out
    mode = 0o640 if args.group is not None else 0o600
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            print(f"kept the existing token in {path}")
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            print(f"wrote a new token to {path}")
        if args.group is not None:
            os.chown(path, -1, args.group)
        os.chmod(path, mode)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {path}: {exc.strerror}") from exc
    return 0
