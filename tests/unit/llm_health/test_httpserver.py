"""llm_health/httpserver.py: the stdlib servers' one handler base."""

from __future__ import annotations

import socket
import struct
import threading
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from llm_health.httpserver import QuietHandler


def test_a_client_gone_before_its_answer_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """The stdlib server printed a traceback (BrokenPipeError) for every client that left before its answer."""
    left = threading.Event()
    answered = threading.Event()

    class Slow(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            left.wait(10)
            try:
                for _ in range(64):                     # the first write may still fit the socket's buffer
                    self.reply(200, b"x" * 65536, "text/plain")
            finally:
                answered.set()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = False        # server_close() joins the handler's thread: whatever it prints is in
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = socket.create_connection(server.server_address[:2], timeout=5)
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # reset, not FIN
        client.close()
        left.set()
        assert answered.wait(10)
        server.shutdown()
    finally:
        server.server_close()
    err: Any = capsys.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err
