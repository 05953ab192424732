"""Busy markers kept as files in `busy_dir` (API markers live in the store).

A job marks backend `gpu-a` busy by creating `<busy_dir>/gpu-a` or `<busy_dir>/gpu-a.<anything>`.
Expiry = the file's mtime + a TTL: the number in the file (`600` or `ttl=600`), else
`busy_file_ttl`. Refresh by touching the file. An unreadable `busy_dir` is treated as "busy"
(fail closed), never as "no markers".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llm_health.remediator.policy import Marker

TTL_RE = re.compile(r"^\s*(?:ttl\s*[=:]\s*)?(\d+(?:\.\d+)?)\s*$", re.IGNORECASE | re.MULTILINE)


def _matches(filename: str, backend: str) -> bool:
    return filename == backend or filename.startswith(backend + ".")


def _ttl(path: Path, default: float) -> float:
    try:
        text = path.read_text(errors="replace")[:4096]
    except OSError:
        return default
    m = TTL_RE.search(text)
    return float(m.group(1)) if m else default


def file_markers(busy_dir: Path, backend: str, default_ttl: float) -> tuple[Marker, ...]:
    """All marker files for `backend` (expired ones included; the policy ignores those)."""
    if not busy_dir.exists():
        return ()
    try:
        names = os.listdir(busy_dir)
    except OSError as exc:
        return (Marker(id="busy_dir", backend=backend, owner=f"unreadable busy_dir: {exc.strerror}",
                       expires_at=float("inf")),)
    out: list[Marker] = []
    for name in sorted(names):
        if name.startswith(".") or not _matches(name, backend):
            continue
        path = busy_dir / name
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue  # removed while we looked
        out.append(Marker(id=f"file:{name}", backend=backend, owner=f"file {path}",
                          expires_at=mtime + _ttl(path, default_ttl)))
    return tuple(out)


def write_marker_file(busy_dir: Path, backend: str, ttl: float, tag: str) -> Path:
    busy_dir.mkdir(parents=True, exist_ok=True)
    path = busy_dir / f"{backend}.{tag}"
    tmp = busy_dir / f".{backend}.{tag}.tmp"
    tmp.write_text(f"ttl={ttl:g}\n")
    os.replace(tmp, path)
    return path
