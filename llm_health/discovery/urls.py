"""Which discovered URLs may receive our reads, probes and API key (link-local, userinfo and the
operator's allow-lists), and the kinds of refusal discovery records."""

from __future__ import annotations

import ipaddress
import socket
from enum import StrEnum
from urllib.parse import urlparse

from llm_health.config import DiscoverySettings


class RefusalKind(StrEnum):
    NAME = "name"                  # no valid backend name
    STATIC = "static"              # a static backend or proxy has the name
    DUPLICATE = "duplicate"        # two or more targets claim the name: neither is restarted
    URL = "url"                    # the URL cannot be told or is malformed
    USERINFO = "userinfo"
    LINK_LOCAL = "link_local"
    NETWORK = "network"            # outside allow_networks
    PORT = "port"                  # outside allow_ports
    PLACEHOLDER = "placeholder"    # restart only: a placeholder could not be filled safely
    NAME_MISMATCH = "name_mismatch"  # restart only: the name is not what the restart acts on


LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a URL's host is (IPv4-mapped IPv6 as its IPv4), None for a host name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def url_refusal(url: str, settings: DiscoverySettings) -> tuple[RefusalKind, str] | None:
    """Why a discovered backend may not be at `url` (None: it may). Pure: names are never resolved.

    Refused: userinfo (`user:pass@`, also percent-encoded in the host part, as Prometheus writes an
    `__address__` holding one) unless allow_userinfo; numeric hosts in a form other than canonical
    dotted-quad or IPv6 (`2852039166`, `0xa9.0xfe.0xa9.0xfe`: the resolver reads them as addresses);
    link-local addresses (169.254.0.0/16, fe80::/10: cloud metadata services) unless allow_link_local;
    outside allow_networks (then host names too: a name cannot be checked without resolving it);
    a port outside allow_ports."""
    p = urlparse(url)
    netloc = p.netloc
    if ("@" in netloc or "%40" in netloc.lower()) and not settings.allow_userinfo:
        return RefusalKind.USERINFO, "its URL holds userinfo (user:password@); allow_userinfo is off"
    hostport = netloc.rpartition("@")[2]
    if "%" in hostport:
        return RefusalKind.URL, f"its address {hostport!r} is percent-encoded"
    try:
        port = p.port or (443 if p.scheme == "https" else 80)
    except ValueError:
        return RefusalKind.URL, f"its address {hostport!r} has no valid port"
    host = p.hostname or ""
    ip = _address(host)
    if ip is None:
        try:
            socket.inet_aton(host)
            return RefusalKind.URL, f"its host {host!r} is an address in a non-canonical form"
        except OSError:
            pass
    if ip is not None and any(ip in net for net in LINK_LOCAL if net.version == ip.version) \
            and not settings.allow_link_local:
        return RefusalKind.LINK_LOCAL, f"its address {ip} is link-local (cloud metadata lives there); " \
            "allow_link_local is off"
    if settings.allow_networks:
        if ip is None:
            return RefusalKind.NETWORK, f"its host {host!r} is a name, not an address: allow_networks is set and " \
                "names are not resolved"
        nets = [ipaddress.ip_network(n) for n in settings.allow_networks]
        if not any(ip in net for net in nets if net.version == ip.version):
            return RefusalKind.NETWORK, f"its address {ip} is outside allow_networks " \
                f"({', '.join(settings.allow_networks)})"
    if settings.allow_ports and port not in settings.allow_ports:
        return RefusalKind.PORT, f"its port {port} is not in allow_ports " \
            f"({', '.join(str(x) for x in settings.allow_ports)})"
    return None
