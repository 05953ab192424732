"""Credentials written in a URL (`http://user:password@host/`) are sent as HTTP Basic auth, as curl and
requests send them, and never as part of the host name.

urllib does not take them out: it hands `user:password@host` to the resolver as a host name, so the
password went out in a DNS query (in clear text, to whatever resolver the host uses) and the request
never reached the host.
"""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit, urlunsplit


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """`url` without its user:password@, and the Authorization header they stand for ({} when none)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=hostport)), {"Authorization": f"Basic {token}"}
