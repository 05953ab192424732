"""Every security check of the HTTP side, on one page (docs/design.md §5 "Watched and safe by default").

* the bearer token (`remediator.token_file`): constant-time compare; mutating requests need it;
* no cross-site request: a foreign `Origin`, or `Sec-Fetch-Site` cross-site/same-site, is refused (403);
* without a token (insecure_no_auth, loopback only) the `Host` must be a loopback name (DNS rebinding);
* bodies: JSON only (415), at most max_body_bytes (413, Content-Length or a chunked body read to the
  limit), valid UTF-8 JSON (RFC 8259: no NaN or Infinity, no key twice in one object: which of two
  `backend` labels would count is anyone's guess) without lone surrogates, nested at most MAX_JSON_DEPTH
  levels (400).

The serving worker (serving.py) bounds what reaches the app at all (head and body sizes, timeouts); these
checks are what the app itself refuses. Every refusal is JSON `{"error": ...}`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from typing import Any
from urllib.parse import urlparse

from flask import Response, jsonify, request

MAX_JSON_DEPTH = 32
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


class BodyError(Exception):
    """A request body refused: `status` and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error(status: int, message: str) -> tuple[Response, int]:
    return jsonify({"error": message}), status


def token_given(token: str) -> bool:
    """The request carries `token` as its bearer token (never true without a token configured)."""
    if not token:
        return False
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def loopback_host(host: str) -> bool:
    if host in ("localhost", "localhost.") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(value: str) -> str:
    return (urlparse(f"//{value}").hostname or "") if value else ""


def cross_site_problem(token: str) -> str:
    """Why this mutating request looks like it came from a web page of another site ('' = fine).

    Browsers send Origin (and Sec-Fetch-Site) on cross-origin POST/PUT/DELETE; Alertmanager, curl and
    our own clients send neither. Without a token (insecure_no_auth, loopback only) the Host header
    must name a loopback address too, against DNS rebinding."""
    origin = request.headers.get("Origin", "")
    if request.headers.get("Sec-Fetch-Site", "") in ("cross-site", "same-site"):
        return f"cross-site request refused (Sec-Fetch-Site {request.headers['Sec-Fetch-Site']})"
    if origin:
        parsed = urlparse(origin)
        if origin == "null" or parsed.netloc.lower() != request.host.lower():
            return f"cross-origin request refused (Origin {origin[:100]!r}, Host {request.host[:100]!r})"
    if not token and not loopback_host(host_of(request.host)):
        return f"Host {request.host[:100]!r} is not a loopback name: refused without a token (DNS rebinding)"
    return ""


def guard_mutation(token: str, max_body_bytes: int) -> tuple[Response, int] | None:
    """For every mutating request: token, no cross-site origin, JSON bodies only; None when it may pass."""
    if token and not token_given(token):
        return error(401, "missing or wrong bearer token")
    problem = cross_site_problem(token)
    if problem:
        return error(403, problem)
    if request.content_length is not None and request.content_length > max_body_bytes:
        return error(413, f"body too large: {request.content_length} bytes > {max_body_bytes}")
    has_body = bool(request.content_length) or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    if (request.content_type or has_body) and request.mimetype != "application/json":
        return error(415, f"Content-Type must be application/json, got {request.content_type[:80]!r}"
                     if request.content_type else "Content-Type must be application/json")
    return None


def depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def json_body(limit: int) -> Any:
    """The request's JSON body, or BodyError (413 / 415 / 400) saying what is wrong with it."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyError(413, f"body too large: {request.content_length} bytes > {limit}")
    if request.mimetype != "application/json":
        raise BodyError(415, "Content-Type must be application/json")
    raw = read_body(limit)
    if len(raw) > limit:
        raise BodyError(413, f"body too large: more than {limit} bytes")
    if not raw.strip():
        raise BodyError(400, "empty body: expected JSON")
    try:
        data = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise BodyError(400, f"body is nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(400, f"body is not valid JSON: {str(exc)[:200]}") from None
    if not depth_ok(data):
        raise BodyError(400, f"body is nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BodyError(400, "body contains a lone surrogate (\\ud800-\\udfff escape): not valid Unicode") from None
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"key {key[:100]!r} appears twice in one object")
        seen.add(key)
    return out


def read_body(limit: int) -> bytes:
    """The body, or its first limit + 1 bytes when it is longer (so the caller can tell).

    A chunked body (no Content-Length) is read from the server's terminated input stream
    (`wsgi.input_terminated`): werkzeug's own stream stops at MAX_CONTENT_LENGTH and returns
    what it has, so a 2 MB body of spaces read as `limit` spaces ("empty body" instead of 413)."""
    if request.content_length is not None or not request.environ.get("wsgi.input_terminated"):
        return request.get_data(cache=False)
    stream = request.environ["wsgi.input"]
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = stream.read(limit + 1 - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)
