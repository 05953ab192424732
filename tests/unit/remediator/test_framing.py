"""remediator/framing.py: where a request in a byte stream ends, fed in any split, judged by gunicorn's parser.

The one property that matters for the serving worker: READY (and INVALID) only when gunicorn, given
exactly the buffered bytes, parses the request and its whole body without asking for more (a thread
would otherwise wait on the socket); MORE as long as gunicorn would still wait.
"""

from __future__ import annotations

import random

import pytest
from gunicorn.config import Config
from gunicorn.http.message import Request
from gunicorn.http.unreader import IterUnreader

from llm_health.remediator.framing import CHUNK_FRAMING_ALLOWANCE, Limits, RequestFraming, Step

CFG = Config()
PEER = ("127.0.0.1", 40000)
LIMITS = Limits(max_header_bytes=4096, max_body_bytes=1000)


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(*parts: bytes, ext: bytes = b"", trailer: bytes = b"") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in parts) + b"0\r\n" + trailer + b"\r\n"


GET = head("GET /healthz HTTP/1.1", "Host: x")
BODY = b'{"alerts": []}\n'
POST = head("POST /webhook HTTP/1.1", "Host: x", f"Content-Length: {len(BODY)}") + BODY
CHUNKED = (head("POST /webhook HTTP/1.1", "Host: x", "Transfer-Encoding: chunked")
           + chunked(BODY[:5], BODY[5:], ext=b";a=b", trailer=b"X-T: 1\r\n"))
COMPLETE = {
    "get": (GET, b""),
    "post": (POST, BODY),
    "chunked": (CHUNKED, BODY),
    "chunked, no trailer": (head("POST / HTTP/1.1", "Host: x", "Transfer-Encoding: chunked") + chunked(BODY), BODY),
    "leading CRLF": (b"\r\n" + GET, b""),
    "HTTP/1.0": (head("GET / HTTP/1.0"), b""),
    "empty chunked": (head("POST / HTTP/1.1", "Host: x", "Transfer-Encoding: chunked") + b"0\r\n\r\n", b""),
}


def feed(data: bytes, splits: list[int] | None = None, limits: Limits = LIMITS) -> tuple[list[Step], RequestFraming]:
    framing = RequestFraming(CFG, PEER, limits)
    cuts = [0, *(splits or []), len(data)]
    steps = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        if a == b:
            continue
        steps.append(framing.feed(data[a:b]))
        if steps[-1] is not Step.MORE:
            break
    return steps, framing


def gunicorn_reads(data: bytes) -> bytes:
    """gunicorn's parser over exactly these bytes: the body, or an error when it wants more."""
    pieces = iter([data])
    unreader = IterUnreader(pieces)
    request = Request(CFG, unreader, PEER)
    return request.body.read()


def random_splits(n: int, rng: random.Random) -> list[int]:
    return sorted(rng.sample(range(1, n), k=min(n - 1, rng.randint(1, 12))))


@pytest.mark.parametrize("name", sorted(COMPLETE))
def test_complete_requests_are_ready_at_their_last_byte_in_any_split(name: str) -> None:
    data, body = COMPLETE[name]
    rng = random.Random(name)
    for splits in ([], list(range(1, len(data))), *(random_splits(len(data), rng) for _ in range(30))):
        steps, framing = feed(data, splits)
        assert steps[-1] is Step.READY, (name, splits, steps)
        assert bytes(framing.data) == data                 # READY at the last byte, not before
    assert gunicorn_reads(data) == body                    # and gunicorn needs no more than that
    for cut in range(1, len(data)):                        # every prefix: gunicorn would still wait
        assert feed(data[:cut])[0][-1] is Step.MORE, (name, cut)


def test_pipelined_requests_keep_the_read_ahead() -> None:
    steps, framing = feed(POST + GET)
    assert steps == [Step.READY] and bytes(framing.data) == POST + GET    # all of it goes to gunicorn
    rest = RequestFraming(CFG, PEER, LIMITS, req_number=2, data=bytes(framing.data[len(POST):]))
    assert rest.step is Step.READY


@pytest.mark.parametrize(("data", "why"), [
    (b"GET /healthz HTTP/1.1\nHost: x\r\n\r\n", "bare LF in the request line"),
    (b"GET / HTTP/1.1\r\nHost: x\n\r\n", "bare LF in a header"),
    (head("POST / HTTP/1.1", "Content-Length: 2", "Transfer-Encoding: chunked"), "CL and TE"),
    (head("POST / HTTP/1.1", "Content-Length: 2", "Content-Length: 2"), "two CL"),
    (head("POST / HTTP/1.1", "Content-Length: -1"), "negative CL"),
    (head("GET / HTTP/1.1", "Bad Header: x"), "space in a header name"),
    (head("POST / HTTP/1.1", "Transfer-Encoding: chunked") + b"zz\r\n", "chunk size not hex"),
    (head("POST / HTTP/1.1", "Transfer-Encoding: chunked") + b"2\r\nabXY", "no CRLF after a chunk"),
    (head("POST / HTTP/1.1", "Transfer-Encoding: chunked") + b"1" * 9000, "chunk-size line too long"),
    (head("POST / HTTP/1.1", "Transfer-Encoding: chunked") + b"0\r\nX: 1\n", "bare LF in a trailer"),
])
def test_what_gunicorn_refuses_is_handed_over_at_once(data: bytes, why: str) -> None:
    steps, _ = feed(data)
    assert steps == [Step.INVALID], why
    with pytest.raises(Exception) as caught:               # gunicorn refuses it too, from these bytes alone
        gunicorn_reads(data)
    assert type(caught.value).__name__ != "NoMoreData", why


def test_head_and_body_limits() -> None:
    assert feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 5000)[0] == [Step.HEAD_TOO_LARGE]     # before its end
    assert feed(head("GET / HTTP/1.1", "X: " + "a" * 5000))[0] == [Step.HEAD_TOO_LARGE]
    assert feed(head("GET / HTTP/1.1", "X: " + "a" * 4000))[0] == [Step.READY]
    big = head("POST / HTTP/1.1", "Content-Length: 1001")
    assert feed(big)[0] == [Step.BODY_TOO_LARGE]                                     # without reading it
    assert feed(head("POST / HTTP/1.1", "Content-Length: 1000") + b" " * 1000)[0] == [Step.READY]
    te = head("POST / HTTP/1.1", "Transfer-Encoding: chunked")
    assert feed(te + chunked(b" " * 1000))[0] == [Step.READY]
    assert feed(te + chunked(b" " * 600, b" " * 401))[0] == [Step.BODY_TOO_LARGE]
    assert feed(te + b"3e9\r\n" + b" " * 1001)[0] == [Step.BODY_TOO_LARGE]       # as soon as it is over
    # framing without content (1-byte chunks with long extensions) is bounded too
    padded = te + b"".join(b"1;e=" + b"x" * 4000 + b"\r\na\r\n" for _ in range(40))
    steps, framing = feed(padded)
    assert steps == [Step.BODY_TOO_LARGE] and framing.body_size <= 40
    assert len(padded) - len(te) > 1000 + CHUNK_FRAMING_ALLOWANCE


def test_expect_100_continue() -> None:
    waiting = head("POST / HTTP/1.1", "Host: x", "Expect: 100-continue", "Content-Length: 5")
    steps, framing = feed(waiting)
    assert steps == [Step.MORE] and framing.expects_continue
    assert framing.feed(b"12345") is Step.READY and not framing.expects_continue
    assert not feed(head("POST / HTTP/1.0", "Expect: 100-continue", "Content-Length: 5"))[1].expects_continue
    assert not feed(head("GET / HTTP/1.1", "Host: x"))[1].expects_continue
