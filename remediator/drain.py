"""Reading HAProxy's view of a server through its stats socket (`show stat`).

Used to confirm that the load balancer took the agent's word (status DRAIN / DOWN, weight) and to see a
drained server's current sessions fall to zero before a restart. Read-only: only `show stat` is sent.
"""

from __future__ import annotations

import csv
import io
import socket
from dataclasses import dataclass


class StatsError(RuntimeError):
    """The stats socket could not be read or answered something unexpected."""


@dataclass(frozen=True)
class ServerStat:
    proxy: str          # pxname: the HAProxy backend (e.g. "vllm")
    server: str         # svname: the server line's name (= llm-health backend name)
    status: str         # UP, DOWN, DRAIN, MAINT, "DOWN (agent)", "DRAIN (agent)", "UP 1/2", ...
    weight: int         # current effective weight
    current_sessions: int   # scur: requests being served now
    total_sessions: int     # stot

    @property
    def draining(self) -> bool:
        return self.status.startswith("DRAIN")

    @property
    def up(self) -> bool:
        return self.status.startswith("UP")

    @property
    def down(self) -> bool:
        return self.status.startswith("DOWN")


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def parse_show_stat(text: str) -> list[ServerStat]:
    """`show stat` CSV -> one ServerStat per server line (FRONTEND/BACKEND summary rows skipped)."""
    text = text.lstrip()
    if not text.startswith("# "):
        raise StatsError(f"not a show stat answer: {text[:120]!r}")
    rows = csv.DictReader(io.StringIO(text[2:]))
    out: list[ServerStat] = []
    for row in rows:
        name = row.get("svname") or ""
        if not name or name in ("FRONTEND", "BACKEND"):
            continue
        out.append(
            ServerStat(
                proxy=row.get("pxname") or "",
                server=name,
                status=row.get("status") or "",
                weight=_int(row.get("weight")),
                current_sessions=_int(row.get("scur")),
                total_sessions=_int(row.get("stot")),
            )
        )
    return out


def stats_command(socket_path: str, command: str, timeout: float = 5.0) -> str:
    """Send one command to the stats socket (a unix socket path) and return the whole answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(socket_path)
            s.sendall(command.encode("ascii") + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except OSError as exc:
        raise StatsError(f"stats socket {socket_path}: {exc}") from exc
    return b"".join(chunks).decode("utf-8", errors="replace")


def show_stat(socket_path: str, timeout: float = 5.0) -> dict[tuple[str, str], ServerStat]:
    """{(proxy, server): ServerStat} for every server HAProxy knows."""
    return {(s.proxy, s.server): s for s in parse_show_stat(stats_command(socket_path, "show stat", timeout))}
