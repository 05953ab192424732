"""Busy markers kept as files in `busy_dir` (API markers live in the store).

One naming rule, exact: a job marks backend `gpu-a` busy by creating `<busy_dir>/gpu-a` or
`<busy_dir>/gpu-a@<tag>`. Backend names never contain `@` and never start with a dot
(config.NAME_RE), so a file belongs to exactly one backend: `gpu.a` is backend `gpu.a`'s marker,
never `gpu`'s; hidden files (`.gpu-a...`, e.g. our own temporary files) are never markers.
Expiry = the file's mtime + a TTL: the number in the file (`600` or `ttl=600`), else
`busy_file_ttl`; either is capped at `marker_max_ttl`. Refresh by touching the file. An mtime
later than the file's ctime (`touch -d 2035-01-01`, a writer's skewed clock) is not believed: the
kernel sets the ctime to its own clock whenever the mtime is set, so the marker counts from then,
and never from later than now. (Counting a future mtime as "now" at each look would renew such a
marker at every look, for as long as its mtime stays ahead.) An unreadable `busy_dir` is treated
as "busy" (fail closed), never as "no markers".
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from llm_health.config import NAME_RE
from llm_health.remediator.policy import Marker

TTL_RE = re.compile(r"^\s*(?:ttl\s*[=:]\s*)?(\d+(?:\.\d+)?)\s*$", re.IGNORECASE | re.MULTILINE)
TAG_SEP = "@"
TAG_RE = re.compile(r"^[A-Za-z0-9_.@:-]{1,128}$")


def marker_backend(filename: str) -> str:
    """The backend a marker file name belongs to, or '' when the name follows no rule."""
    name, _, tag = filename.partition(TAG_SEP)
    if not NAME_RE.match(name):
        return ""
    if _ and not TAG_RE.match(tag):
        return ""
    return name


def marker_file_name(backend: str, tag: str) -> str:
    if not NAME_RE.match(backend):
        raise ValueError(f"backend name {backend!r} must match {NAME_RE.pattern}")
    clean = re.sub(r"[^A-Za-z0-9_.:-]", "-", tag)[:128] or "job"
    return f"{backend}{TAG_SEP}{clean}"


TTL_READ_LIMIT = 4096    # bytes of a marker file read for its TTL


def _ttl(path: Path, default: float, cap: float) -> float:
    """The TTL written in the file, else `default`; capped. Read inside the claim's transaction, so it
    never blocks and never reads much: only the first TTL_READ_LIMIT bytes of a REGULAR file, opened
    non-blocking (a FIFO, a device such as /dev/zero, or a huge file in the group-writable busy_dir
    must not hold the state database's write lock). Anything else counts with the default TTL."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return min(default, cap)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return min(default, cap)
        text = os.read(fd, TTL_READ_LIMIT).decode(errors="replace")
    except OSError:
        return min(default, cap)
    finally:
        os.close(fd)
    m = TTL_RE.search(text)
    return min(float(m.group(1)) if m else default, cap)


def file_markers(busy_dir: Path, backend: str, default_ttl: float,
                 max_ttl: float = float("inf"), *, now: float) -> tuple[Marker, ...]:
    """All marker files for `backend` (expired ones included; the policy ignores those), as seen at `now`
    (wall time): each expires at min(mtime, ctime, now) + its TTL, never later than now + max_ttl and
    never later than max_ttl after the file last changed."""
    if not busy_dir.exists():
        return ()
    try:
        names = os.listdir(busy_dir)
    except OSError as exc:
        return (Marker(id="busy_dir", backend=backend, owner=f"unreadable busy_dir: {exc.strerror}",
                       expires_at=float("inf")),)
    out: list[Marker] = []
    for name in sorted(names):
        if marker_backend(name) != backend:
            continue
        path = busy_dir / name
        try:
            st = path.stat()
        except OSError:
            continue  # removed while we looked
        touched = min(st.st_mtime, st.st_ctime, now)
        out.append(Marker(id=f"file:{name}", backend=backend, owner=f"file {path}",
                          expires_at=touched + _ttl(path, default_ttl, max_ttl)))
    return tuple(out)


def write_marker_file(busy_dir: Path, backend: str, ttl: float, tag: str) -> Path:
    busy_dir.mkdir(parents=True, exist_ok=True)
    name = marker_file_name(backend, tag)
    path = busy_dir / name
    tmp = busy_dir / f".{name}.tmp"
    tmp.write_text(f"ttl={ttl:g}\n")
    os.replace(tmp, path)
    return path
