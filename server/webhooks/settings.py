"""The server's webhook settings (``--webhook-*`` flags), and the allow-list
every destination is checked against: when a client names a URL, and again
before each attempt (``allowed``), so a URL a client can dress up (dot
segments, encoded slashes, credentials, a longer host) never leaves the
prefixes the operator allowed. Which list is a principal's own business: its
keys-file lines may name one (``Trust``, ``runtime.webhook_trust``), else
``--webhook-allow`` applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.outbound import shape_problem, under
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


def _problem(url: str, allow: Sequence[str], own: bool = False) -> str:
    if problem := shape_problem(url):
        return problem
    if not any(under(url, prefix) for prefix in allow):
        whose = "your key's allow-list" if own else "its allow-list"
        if not allow:
            return f"is not a destination this server sends your webhooks to ({whose} is empty)"
        return f"is not a destination this server sends your webhooks to (see {whose})"
    return ""
