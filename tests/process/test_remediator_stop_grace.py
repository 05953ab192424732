"""A worker that begins a graceful stop (a reload replaces every worker) still answers a connection it
accepted a moment before, whose request had not arrived yet: closing it at once reset it under the client
(seen as ConnectionResetError on a request sent while `systemctl reload` replaced the workers).

Real remediator, one worker; the worker is stopped the way gunicorn's master stops old workers (SIGTERM).
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
from pathlib import Path

from llm_health.drill.procs import free_port, wait_until
from tests.support.remediator_process import Remediator


def worker_pid(log: str) -> int | None:
    found = re.findall(r"Booting worker with pid: (\d+)", log)
    return int(found[-1]) if found else None


def server_socket_inode(server_port: int, client_port: int) -> int:
    """The inode of the server's end of a loopback connection (0 while it waits in the accept queue)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            return int(fields[9])
    return 0


def holds(pid: int, inode: int) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            if os.readlink(fd) == f"socket:[{inode}]":
                return True
        except OSError:
            continue
    return False


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes or resets the connection within `within` seconds (nothing sent)."""
    readable, _, _ = select.select([sock], [], [], within)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def test_a_stopping_worker_answers_a_connection_accepted_just_before(tmp_path: Path) -> None:
    r = Remediator(tmp_path, {"backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}",
                                            "restart": ["true"]}]})
    try:
        r.wait_ready()
        pid = wait_until(lambda: worker_pid(r.proc.log()), timeout=10, what="the worker's pid")
        sock = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        try:
            client_port = sock.getsockname()[1]
            wait_until(lambda: (inode := server_socket_inode(r.port, client_port)) and holds(pid, inode),
                       timeout=10, interval=0.01, what="the worker accepting the connection")
            os.kill(pid, signal.SIGTERM)                       # what the master does to an old worker
            # the worker stops accepting and finishes what it has; this connection is part of it
            assert not closed_by_server(sock, within=0.5), "the stopping worker closed a fresh connection"
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        finally:
            sock.close()
        r.proc.wait_http(r.url + "/healthz", timeout=30)   # the master started a new worker
    finally:
        r.stop()
