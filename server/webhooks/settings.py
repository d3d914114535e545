"""The server's webhook settings (``--webhook-*`` flags), and the allow-list
every destination is checked against: when a client names a URL, and again
before each attempt (``allowed``), so a URL a client can dress up (dot
segments, encoded slashes, credentials, a longer host) never leaves the
prefixes the operator allowed. Which list is a principal's own business: its
keys-file lines may name one (``Trust``, ``runtime.webhook_trust``), else
``--webhook-allow`` applies.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httpx

from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.webhook_trust import (
    DEFAULT_TRUST,
    WebhookTrust,
    parse_prefixes,
    read_secret,
)

__all__ = [
    "NO_TRUST",
    "Trust",
    "WebhookSettings",
    "allowed",
    "check_destination",
    "settings_from",
]

MAX_URL_CHARS = 2048


@dataclass(frozen=True)
class WebhookSettings:
    """Where webhooks may go and how hard they are tried."""

    # Allowed destinations: URL prefixes (scheme://host[:port][/path]), for
    # the principals whose keys-file lines name none of their own.
    allow: Sequence[str] = ()
    # The signing secret, Standard Webhooks' form ("whsec_" + base64), of
    # the principals without their own; none, no webhooks.
    secret: str = ""
    max_attempts: int = 8
    first_retry_seconds: float = 1.0
    max_retry_seconds: float = 600.0
    timeout_seconds: float = 10.0
    # Notices waiting in the outbox, at most; of one principal's turns, at
    # most (one tenant's failing receiver cannot crowd the others out).
    max_pending: int = 10_000
    max_pending_per_owner: int = 1_000
    # Deliveries in flight at once, from this server; of one principal's
    # turns, at most (one tenant's slow or failing receiver cannot hold
    # every slot: the others' notices are claimed past its own).
    concurrency: int = 8
    max_in_flight_per_owner: int = 2


class Trust(Protocol):
    """Where a principal's webhook trust is read (``runtime.auth.ApiKeys``:
    its keys-file lines, as reloaded)."""

    def webhook_trust(self, principal: str) -> WebhookTrust: ...


class _NoTrust:
    def webhook_trust(self, principal: str) -> WebhookTrust:
        return DEFAULT_TRUST


# A server without a keys file: every principal has the server's list and secret.
NO_TRUST: Trust = _NoTrust()


def settings_from(
    allow: str | None,
    secret_file: str | None,
    max_attempts: int = 8,
    first_retry_seconds: float = 1.0,
    timeout_seconds: float = 10.0,
) -> WebhookSettings:
    """The server's webhook settings from its flags; ValueError, in words
    for the operator, if they cannot work."""
    try:
        prefixes = parse_prefixes(allow or "")
    except ValueError as error:
        raise ValueError(f"--webhook-allow: {error}") from None
    if prefixes and not secret_file:
        raise ValueError("--webhook-allow needs --webhook-secret-file (the signing secret)")
    try:
        secret = read_secret(Path(secret_file)) if secret_file else ""
    except ValueError as error:
        raise ValueError(f"--webhook-secret-file: {error}") from None
    return WebhookSettings(
        allow=prefixes,
        secret=secret,
        max_attempts=max_attempts,
        first_retry_seconds=first_retry_seconds,
        timeout_seconds=timeout_seconds,
    )


def check_destination(url: str, allow: Sequence[str], field_name: str, own: bool = False) -> str:
    """The webhook URL, if the allow-list lets notices go there (``own``:
    the list is the caller's principal's, not the server's)."""
    problem = _problem(url, allow, own)
    if problem:
        raise InvalidArgument([FieldViolation(field_name, problem)])
    return url


def allowed(url: str, allow: Sequence[str]) -> bool:
    return not _problem(url, allow)


# Path segments a client or the receiver's server may normalise away (httpx
# does), which would take a request out of the allowed prefix:
# "/team-a/../admin" is "/admin".
_DOT_SEGMENTS = frozenset({".", ".."})
# Percent-encoded "/" and "\\": servers that decode them before they route
# make "/team-a/..%2fadmin" the "/admin" that the prefix check never saw.
_ENCODED_SEPARATORS = re.compile(r"%(2f|5c)", re.IGNORECASE)


# A "%" in a path that is not the escape of an ASCII byte.
_ODD_ESCAPE = re.compile(r"%(?![0-7][0-9a-fA-F])")


def _problem(url: str, allow: Sequence[str], own: bool = False) -> str:
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
    if not any(_under(url, prefix) for prefix in allow):
        whose = "your key's allow-list" if own else "its allow-list"
        if not allow:
            return f"is not a destination this server sends your webhooks to ({whose} is empty)"
        return f"is not a destination this server sends your webhooks to (see {whose})"
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


def _under(url: str, prefix: str) -> bool:
    # A prefix that ends at a host must end there: an allowed
    # "https://hooks.example.com" admits its paths on the default port, never
    # "https://hooks.example.com.evil" nor "https://hooks.example.com:6379"
    # (a port must be named: "https://hooks.example.com:8443").
    if not url.startswith(prefix):
        return False
    rest = url[len(prefix) :]
    return prefix.endswith("/") or rest == "" or rest[0] in "/?#"
