"""Server URLs and loopback hosts: the one check of each, shared by the CLI (generate, bench,
load), app.py's --server flags and the app's Serving engine tab.

Only the standard library: the app's policy imports this without the serving client.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from ..core.errors import SpecvizError

MAX_URL_CHARS = 2048  # longer is no server address; refused before parsing
LOOPBACK_NAMES = ("localhost",)


def check_url(url, name: str = "the server URL") -> str:
    """`url` without surrounding spaces, if it is http(s) with a host (and a valid port, if any);
    else SpecvizError naming `name`, the flag or field it came from (e.g. "--baseline-server")."""
    text = "" if url is None else str(url).strip()
    try:
        parts = urlsplit(text) if len(text) <= MAX_URL_CHARS else None
        good = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
        good = good and (parts.port is None or parts.port > 0)  # .port raises for "h:abc", "h:99999"
    except ValueError:  # "http://[::1" and other unparseable hosts
        good = False
    if not good:
        raise SpecvizError(f"{name} must be an http:// or https:// address with a host, "
                           f"for example http://127.0.0.1:8000 (got {text[:80]!r})")
    return text


def base_url(url, name: str = "the server URL") -> str:
    """The server's base URL, checked, without a trailing slash or /v1 (the client adds the paths)."""
    base = check_url(url, name).rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def is_loopback(host: str | None) -> bool:
    """Is `host` this machine: localhost, 127.0.0.0/8 or ::1 (also as ::ffff:127.x.y.z, and in [brackets]).

    No DNS: any other name could point anywhere, so it counts as remote."""
    host = (host or "").strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # Python before 3.13 calls ::ffff:127.0.0.1 not loopback
    return ip.is_loopback or bool(mapped and mapped.is_loopback)
