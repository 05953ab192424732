"""`llm-health dashboards render [--out DIR]`: write the shipped Grafana dashboards (JSON).

The dashboards are generated in the repository (dashboards/generate.py) and shipped in the wheel;
this writes them where Grafana's file provisioning (or a ConfigMap build) picks them up. Everything
is read before anything is written; an existing file is replaced atomically.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from llm_health import assets
from llm_health.config import ConfigError

DEFAULT_OUT = Path("dashboards")


def render() -> dict[str, str]:
    """File name -> dashboard JSON text (validated as JSON)."""
    out: dict[str, str] = {}
    for path in assets.dashboard_files():
        text = path.read_text(encoding="utf-8")
        try:
            json.loads(text)
        except ValueError as exc:
            raise assets.AssetError(f"shipped dashboard {path.name} is not JSON: {exc}") from None
        out[path.name] = text
    return out


def write_rendered(out_dir: Path) -> list[Path]:
    texts = render()
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out: {out_dir} exists and is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        target = out_dir / name
        if target.resolve() == (assets.folder("dashboards") / name).resolve():
            written.append(target)  # rendering onto the shipped copy itself: already there
            continue
        with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
            tmp.write(text)
        Path(tmp.name).replace(target)
        written.append(target)
    return written


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dashboards_command", metavar="ACTION")
    sub.required = True
    render_p = sub.add_parser("render", help="write the Grafana dashboards (JSON) into DIR")
    render_p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    for path in write_rendered(args.out):
        print(f"wrote {path}")
    return 0
