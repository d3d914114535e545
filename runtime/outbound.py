"""The rules every URL the mesh calls out to must pass: webhook receivers
(``server.webhooks.settings``) and remote A2A agents (``agent.a2a_link``).
Each keeps its own allow-list of URL prefixes; here is what makes a URL one
that cannot leave the prefix it was checked against, whatever a client or a
remote dresses it up as (dot segments, encoded slashes, credentials, a
longer host), and what being under a prefix means.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote, urlsplit

import httpx

__all__ = ["MAX_URL_CHARS", "shape_problem", "under"]

MAX_URL_CHARS = 2048

# Path segments a client or the receiver's server may normalise away (httpx
# does), which would take a request out of the allowed prefix:
# "/team-a/../admin" is "/admin".
_DOT_SEGMENTS = frozenset({".", ".."})
# Percent-encoded "/" and "\\": servers that decode them before they route
# make "/team-a/..%2fadmin" the "/admin" that the prefix check never saw.
_ENCODED_SEPARATORS = re.compile(r"%(2f|5c)", re.IGNORECASE)
# A "%" in a path that is not the escape of an ASCII byte.
_ODD_ESCAPE = re.compile(r"%(?![0-7][0-9a-fA-F])")


def shape_problem(url: str) -> str:
    """What makes the URL one a prefix check cannot hold ("" if nothing)."""
    if len(url) > MAX_URL_CHARS:
        return f"at most {MAX_URL_CHARS} characters"
    if "\\" in url or any(c.isspace() or not c.isprintable() for c in url):
        return "must not hold spaces, control characters or backslashes"
    if not url.isascii():
        # Sent percent-encoded, and normalised by some servers: two
        # fullwidth dots (U+FF0E) are ".." to them.
        return "must hold only ASCII characters (percent-encode the others)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not one
        httpx.URL(url)  # what the sender will make of it
    except (ValueError, httpx.InvalidURL):
        return "must be an http or https URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http or https URL"
    if parts.username or parts.password:
        return "must not carry credentials"
    if _ODD_ESCAPE.search(parts.path):
        # IIS's %u002e and overlong UTF-8 (%c0%ae) are dots and slashes to
        # some servers: only escapes of ASCII characters are taken.
        return "must hold only percent-escapes of ASCII characters (%00-%7F) in its path"
    if _ENCODED_SEPARATORS.search(parts.path):
        return "must not hold percent-encoded slashes or backslashes (%2F, %5C) in its path"
    if any(_dot_segment(segment) for segment in parts.path.split("/")):
        return "must not hold . or .. path segments"
    return ""


def _dot_segment(segment: str) -> bool:
    """Whether a server could read the segment as "." or "..": decoded once
    or more ("%252e" is "%2e" is "."), in compatibility form (fullwidth dots
    are dots), or before a ";" parameter (some servers read "..;" as "..")."""
    for _ in range(4):  # each decoding level in turn; more would be absurd
        plain = unicodedata.normalize("NFKC", segment)
        if plain.split(";", 1)[0] in _DOT_SEGMENTS or "/" in plain or "\\" in plain:
            return True
        decoded = unquote(segment)
        if decoded == segment:
            return False
        segment = decoded
    return True  # still encoded after that: nothing a sender means


def under(url: str, prefix: str) -> bool:
    """Whether ``url`` is under the allowed ``prefix``. A prefix that ends at
    a host must end there: an allowed "https://hooks.example.com" admits its
    paths on the default port, never "https://hooks.example.com.evil" nor
    "https://hooks.example.com:6379" (a port must be named:
    "https://hooks.example.com:8443")."""
    if not url.startswith(prefix):
        return False
    rest = url[len(prefix) :]
    return prefix.endswith("/") or rest == "" or rest[0] in "/?#"
