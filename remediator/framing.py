"""Where does the HTTP/1.1 request in these bytes end? Bytes in, a `Step` out; no sockets, no clock.

The serving worker (remediator/serving.py) buffers each connection's bytes in its event loop and asks
`RequestFraming.feed` after every read. The request head is parsed by gunicorn's own parser
(`gunicorn.http.message.Request`, fed the buffered bytes), so gunicorn's validation and its framing
decision (Content-Length, chunked, neither) are the ones used; whatever gunicorn refuses is handed
over unchanged, and gunicorn answers it (400, 501, ...) as it always does. The body is only counted:
`Content-Length` bytes, or a chunked body scanned chunk by chunk (leniently: a stricter scan than
gunicorn's could hand over a body gunicorn still waits for). The worker then gives the whole buffer to
gunicorn again in a pool thread, which parses it for real without waiting on the socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from gunicorn.http.body import ChunkedReader, LengthReader
from gunicorn.http.message import Request
from gunicorn.http.unreader import Unreader

HEX = frozenset(b"0123456789abcdefABCDEF")
CHUNK_FRAMING_ALLOWANCE = 65536   # chunk-size lines, extensions and trailers beyond max_body_bytes


class Step(Enum):
    MORE = "more"                      # not complete yet: keep reading, no thread
    READY = "ready"                    # head and body are buffered: hand it to a thread
    INVALID = "invalid"                # gunicorn refuses what is buffered: hand it over, gunicorn answers
    HEAD_TOO_LARGE = "head_too_large"  # 431: the head is longer than max_header_bytes
    BODY_TOO_LARGE = "body_too_large"  # 413: the body is longer than max_body_bytes


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 65536
    max_body_bytes: int = 1_048_576


class _Incomplete(Exception):
    """gunicorn's parser asked for bytes that have not arrived yet."""


class _Buffered(Unreader):
    """gunicorn's Unreader over the bytes received so far; asking for more raises _Incomplete."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = data

    def chunk(self, size_hint: int | None = None) -> bytes:
        if not self._data:
            raise _Incomplete
        data, self._data = self._data, b""
        return data

    def rest(self) -> bytes:
        return self.buf.getvalue() + self._data


class _Chunks:
    """A chunked body (RFC 9112 7.1) scanned as it arrives: where it ends, how large it is."""

    SIZE, DATA, CRLF, TRAILERS = range(4)

    def __init__(self, line_limit: int, trailer_limit: int, max_decoded: int) -> None:
        self.line_limit, self.trailer_limit, self.max_decoded = line_limit, trailer_limit, max_decoded
        self.max_raw = max_decoded + CHUNK_FRAMING_ALLOWANCE
        self.state = self.SIZE
        self.buf = bytearray()
        self.pos = 0              # start of the unconsumed part of buf
        self.remaining = 0        # bytes left in the current chunk
        self.decoded = 0
        self.raw = 0

    def feed(self, data: bytes) -> Step:
        self.raw += len(data)
        if self.raw > self.max_raw:
            return Step.BODY_TOO_LARGE
        if self.pos > 65536:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += data
        while True:
            if self.state == self.SIZE:
                end = self.buf.find(b"\r\n", self.pos)
                if end < 0:
                    return Step.INVALID if len(self.buf) - self.pos > self.line_limit else Step.MORE
                line = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                size, semicolon, _ = line.partition(b";")
                if semicolon:
                    size = size.rstrip(b" \t")
                if not size or not HEX.issuperset(size):
                    return Step.INVALID          # gunicorn: InvalidChunkSize
                self.remaining = int(size, 16)
                self.state = self.DATA if self.remaining else self.TRAILERS
            elif self.state == self.DATA:
                take = min(self.remaining, len(self.buf) - self.pos)
                self.pos += take
                self.remaining -= take
                self.decoded += take
                if self.decoded > self.max_decoded:
                    return Step.BODY_TOO_LARGE
                if self.remaining:
                    return Step.MORE
                self.state = self.CRLF
            elif self.state == self.CRLF:
                if len(self.buf) - self.pos < 2:
                    return Step.MORE
                if self.buf[self.pos:self.pos + 2] != b"\r\n":
                    return Step.INVALID          # gunicorn: ChunkMissingTerminator
                self.pos += 2
                self.state = self.SIZE
            else:                                # trailer section, as gunicorn's parse_trailers reads it
                rest = self.buf[self.pos:]
                if rest[:2] == b"\r\n" or rest.find(b"\r\n\r\n") >= 0:
                    return Step.READY
                if len(rest) > self.trailer_limit or rest.count(b"\n") != rest.count(b"\r\n"):
                    return Step.INVALID
                return Step.MORE


class RequestFraming:
    """One request's bytes as they arrive (the first bytes may be a previous read's read-ahead)."""

    def __init__(self, cfg: Any, peer: Any, limits: Limits, req_number: int = 1, data: bytes = b"") -> None:
        self.cfg, self.peer, self.limits, self.req_number = cfg, peer, limits, req_number
        self.data = bytearray()
        self.request: Request | None = None   # gunicorn's parse of the head, once complete
        self.head_len = 0
        self.length = 0                       # Content-Length (0: no body or chunked)
        self.chunks: _Chunks | None = None
        self.step = Step.MORE
        self._end_from = 0                    # the head's end (CRLF CRLF) is searched from here
        self._lf_from = 0                     # and a bare LF (which gunicorn refuses) from here
        if data:
            self.feed(data)

    @property
    def expects_continue(self) -> bool:
        """The client waits for `100 Continue` before it sends the body (Expect: 100-continue)."""
        return (self.step is Step.MORE and self.request is not None
                and bool(getattr(self.request, "_expected_100_continue", False)))

    @property
    def body_size(self) -> int:
        return self.length if self.chunks is None else self.chunks.decoded

    def feed(self, chunk: bytes) -> Step:
        if self.step is not Step.MORE:
            raise RuntimeError(f"feed after {self.step}")
        self.data += chunk
        if self.request is None:
            self.step = self._head()
            if self.request is None:
                return self.step
            body = bytes(self.data[self.head_len:])
        else:
            body = chunk
        self.step = self._body(body)
        return self.step

    def _head(self) -> Step:
        data = self.data
        while True:
            end = data.find(b"\r\n\r\n", self._end_from)
            stop = end if end >= 0 else len(data)
            lf = data.find(b"\n", self._lf_from, stop)
            while lf > 0 and data[lf - 1] == 13:                          # part of a CRLF
                lf = data.find(b"\n", lf + 1, stop)
            if lf < 0 and end < 0:                                        # no candidate yet
                self._end_from, self._lf_from = max(self._end_from, len(data) - 3), len(data)
                return Step.HEAD_TOO_LARGE if len(data) > self.limits.max_header_bytes else Step.MORE
            at = lf if lf >= 0 else end
            if at > self.limits.max_header_bytes:
                return Step.HEAD_TOO_LARGE
            # a bare LF or the end of the head: gunicorn says whether that is a request head (or refuses it)
            unreader = _Buffered(bytes(data))
            try:
                request = Request(self.cfg, unreader, self.peer, self.req_number)
            except _Incomplete:
                if lf >= 0:
                    self._lf_from = lf + 1
                else:
                    self._end_from = end + 1
                continue
            except Exception:    # noqa: BLE001 - any refusal: gunicorn refuses it again in the thread, and answers
                return Step.INVALID
            self.request = request
            self.head_len = len(data) - len(unreader.rest())
            return Step.MORE

    def _body(self, body: bytes) -> Step:
        request = self.request
        assert request is not None
        reader = getattr(request.body, "reader", None)
        if self.chunks is None and isinstance(reader, ChunkedReader):
            self.chunks = _Chunks(getattr(reader, "limit_chunk_size_line", 8190),
                                  getattr(reader, "limit_trailer_section", 8190 * 32), self.limits.max_body_bytes)
        if self.chunks is not None:
            return self.chunks.feed(body)
        self.length = int(getattr(reader, "length", 0)) if isinstance(reader, LengthReader) else 0
        if self.length > self.limits.max_body_bytes:
            return Step.BODY_TOO_LARGE
        return Step.READY if len(self.data) - self.head_len >= self.length else Step.MORE
