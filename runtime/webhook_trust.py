"""A principal's webhook trust, from its lines of the API keys file
(``runtime.auth``): where its sessions' webhooks may go (``webhooks=``, URL
prefixes that replace the server's ``--webhook-allow`` for it), and the secret
its notices are signed with (``webhook-secret=``, a file holding a Standard
Webhooks ``whsec_`` secret that replaces the server's for it).

Here, not with the webhook sender, because the keys file is read here
(``runtime`` never imports ``server``); the sender asks ``ApiKeys`` for a
principal's trust at each check and each delivery, so a reloaded keys file
applies to notices already queued too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from standardwebhooks import Webhook

__all__ = [
    "DEFAULT_TRUST",
    "WebhookTrust",
    "joined",
    "parse_prefixes",
    "read_secret",
    "with_secret",
]

# A secret file is a line: more is not a secret of Standard Webhooks' form.
MAX_SECRET_BYTES = 4096


@dataclass(frozen=True)
class WebhookTrust:
    """What a principal's keys-file lines say of its webhooks."""

    # URL prefixes its sessions' webhooks may go to: None, the server's
    # --webhook-allow; () none at all.
    allow: tuple[str, ...] | None = None
    # The file its notices' secret is read from ("": the server's secret),
    # and the secret read from it.
    secret_file: str = ""
    secret: str = ""


DEFAULT_TRUST = WebhookTrust()


def parse_prefixes(text: str) -> tuple[str, ...]:
    """Comma-separated http(s) URL prefixes (blanks dropped, repeats once);
    ValueError naming the item's position (never its text: it sits on a
    line beside a key)."""
    prefixes: list[str] = []
    for position, raw in enumerate(text.split(","), start=1):
        prefix = raw.strip()
        if not prefix:
            continue
        try:
            parts = urlsplit(prefix)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            valid = False
        if not valid:
            raise ValueError(f"item {position} is not an http(s) URL prefix")
        if prefix not in prefixes:
            prefixes.append(prefix)
    return tuple(prefixes)


def read_secret(path: Path) -> str:
    """A Standard Webhooks secret (``whsec_`` + base64) from its file;
    ValueError in words for the operator (the file's text never)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{exc.strerror or 'cannot read it'}: {path}") from None
    try:
        secret = raw.decode("ascii").strip()
        if len(raw) > MAX_SECRET_BYTES:
            raise ValueError
        Webhook(secret)
    except Exception:  # whatever the library raises for a bad one
        raise ValueError(f"not a Standard Webhooks secret (whsec_<base64>): {path}") from None
    return secret


def joined(first: WebhookTrust, second: WebhookTrust) -> WebhookTrust:
    """One principal's trust from two of its lines: the prefixes of both (a
    line without ``webhooks=`` adds none), and the one secret file they name
    (ValueError if they name different ones)."""
    if first.secret_file and second.secret_file and first.secret_file != second.secret_file:
        raise ValueError("another line of its principal names another webhook-secret")
    allow = first.allow
    if second.allow is not None:
        allow = (*(allow or ()), *(p for p in second.allow if p not in (allow or ())))
    return WebhookTrust(allow, first.secret_file or second.secret_file)


def with_secret(trust: WebhookTrust, base: Path) -> WebhookTrust:
    """The trust with its secret read (a relative file is the keys file's
    neighbour); ValueError if it cannot be."""
    if not trust.secret_file:
        return trust
    path = base / trust.secret_file
    return dataclasses.replace(trust, secret=read_secret(path))
