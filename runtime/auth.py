"""Public API keys: `Authorization: Bearer KEY`, checked against stored hashes.

Keys come from configuration (plain, hashed at start) and/or a file that is
re-read when it changes (no restart). Each key names a principal
(``runtime.principals``): the sessions it creates are that principal's. A file
line is one of::

    KEY                           principal key-<first 16 hex of sha256(KEY)>
    sha256:HEX                    the same key stored only as its hash
    NAME<TAB>KEY[<TAB>OPTION]...  principal NAME (several keys may share one)
    NAME<TAB>sha256:HEX[<TAB>OPTION]...

where each OPTION, at most once a line, is ``admin``, ``webhooks=PREFIX,...``
(the URL prefixes the principal's webhooks may go to, in place of the
server's ``--webhook-allow``; empty: none) or ``webhook-secret=FILE`` (its
notices' signing secret, in place of the server's; relative to the keys
file's folder), ``runtime.webhook_trust``. A principal's lines add up: its
prefixes are all of theirs, and they name one secret file at most.

So ``KEY`` and ``sha256:`` of it name the same principal, and a line without a
tab means what it always did (a key holding a tab would now read as a name).
Blank lines and ``#`` comments are skipped. A malformed line refuses the file
at start, and keeps the keys loaded before on a reload; the message names the
line's number, never its text. Deleting the file revokes its keys (once it is
still gone at the next check, a second later); a secret file it names is read
again when it or the keys file changes. A key is never logged, echoed or a metric label.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from turnmesh.runtime.errors import Unauthenticated
from turnmesh.runtime.principals import ADMIN, ANONYMOUS, PRINCIPAL_PATTERN, Principal
from turnmesh.runtime.webhook_trust import (
    DEFAULT_TRUST,
    WebhookTrust,
    joined,
    parse_prefixes,
    with_secret,
)

log = logging.getLogger(__name__)

RELOAD_CHECK_SECONDS = 1.0


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def derived_principal(digest: bytes) -> Principal:
    """The principal of a key given without a name: from its hash."""
    return Principal(f"key-{digest.hex()[:16]}")


class KeysFileError(ValueError):
    """A line of the keys file that is not a key (its number, not its text)."""


@dataclass
class KeysFile:
    """A keys file read: its keys' principals, and the webhook trust of the
    principals whose lines say something of webhooks."""

    keys: dict[bytes, Principal] = field(default_factory=dict)
    webhooks: dict[str, WebhookTrust] = field(default_factory=dict)


def parse_keys(text: str) -> dict[bytes, Principal]:
    return parse_keys_file(text).keys


def parse_keys_file(text: str) -> KeysFile:
    """The file's keys and webhook trust (secrets not read yet: ``with_secret``)."""
    parsed = KeysFile()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        try:
            if len(fields) == 1:
                digest = _digest(fields[0])
                parsed.keys[digest] = derived_principal(digest)
                continue
            name = fields[0].strip()
            if not PRINCIPAL_PATTERN.fullmatch(name) or name == ANONYMOUS:
                raise ValueError(
                    "a principal is 1-64 characters of A-Z a-z 0-9 . _ @ - (not 'anonymous')"
                )
            admin, trust = _options(fields[2:])
            parsed.keys[_digest(fields[1].strip())] = Principal(name, admin=admin)
            if trust != DEFAULT_TRUST:
                parsed.webhooks[name] = joined(parsed.webhooks.get(name, DEFAULT_TRUST), trust)
        except ValueError as error:
            raise KeysFileError(f"line {number}: {error}") from None
    return parsed


def _options(fields: list[str]) -> tuple[bool, WebhookTrust]:
    """A named line's options after its key: whether it is an admin's, and
    what it says of the principal's webhooks."""
    admin = False
    allow: tuple[str, ...] | None = None
    secret_file = ""
    seen: set[str] = set()
    for option in (f.strip() for f in fields):
        kind, equals, value = option.partition("=")
        valid = kind == ADMIN if not equals else kind in ("webhooks", "webhook-secret")
        if kind in seen or not valid:
            raise ValueError(
                "expected NAME<TAB>KEY, then at most one each of <TAB>admin,"
                " <TAB>webhooks=PREFIX,... and <TAB>webhook-secret=FILE"
            )
        seen.add(kind)
        if kind == ADMIN:
            admin = True
        elif kind == "webhooks":
            try:
                allow = parse_prefixes(value)
            except ValueError as error:
                raise ValueError(f"webhooks=: {error}") from None
        elif not value.strip():
            raise ValueError("webhook-secret= names no file")
        else:
            secret_file = value.strip()
    return admin, WebhookTrust(allow, secret_file)


def _digest(field: str) -> bytes:
    if not field:
        raise ValueError("a key is missing")
    if field.startswith("sha256:"):
        digest = bytes.fromhex(field.removeprefix("sha256:"))  # ValueError if not hex
        if len(digest) != 32:
            raise ValueError("sha256: takes 64 hex digits")
        return digest
    return key_hash(field)


class ApiKeys:
    def __init__(self, keys: Iterable[str] = (), file: str | None = None) -> None:
        self._static = {key_hash(k): derived_principal(key_hash(k)) for k in keys if k}
        self._file = Path(file) if file else None
        self._file_keys: dict[bytes, Principal] = {}
        self._file_webhooks: dict[str, WebhookTrust] = {}
        # The secret files the keys file named when last read: a change to
        # one reloads it, as a change to the file does.
        self._secret_files: tuple[Path, ...] = ()
        self._file_stamp: tuple[int, ...] | None = None
        self._missing = False  # the file was gone at the last check
        self._checked = 0.0
        if self._file is not None:
            self._reload(force=True)

    @property
    def configured(self) -> bool:
        self._maybe_reload()
        return bool(self._static or self._file_keys or self._file is not None)

    def check(self, presented: str) -> bool:
        return self.match(presented) is not None

    def match(self, presented: str) -> Principal | None:
        """The principal of the key, or None. Constant time per stored key."""
        self._maybe_reload()
        digest = key_hash(presented)
        matched: Principal | None = None
        for stored, principal in (*self._static.items(), *self._file_keys.items()):
            if hmac.compare_digest(digest, stored):
                matched = principal
        return matched

    def principals(self) -> set[str]:
        """The names of every principal a key names."""
        self._maybe_reload()
        return {p.name for p in (*self._static.values(), *self._file_keys.values())}

    def webhook_trust(self, principal: str) -> WebhookTrust:
        """What the keys file says of the principal's webhooks (nothing: the
        server's allow-list and secret)."""
        self._maybe_reload()
        return self._file_webhooks.get(principal, DEFAULT_TRUST)

    def webhook_principals(self) -> set[str]:
        """The principals whose lines say something of their webhooks."""
        self._maybe_reload()
        return set(self._file_webhooks)

    def _maybe_reload(self) -> None:
        if self._file is None or time.monotonic() - self._checked < RELOAD_CHECK_SECONDS:
            return
        self._reload(force=False)

    def _stamp(self, file: Path) -> tuple[int, ...]:
        """When the keys file changed (FileNotFoundError if it is gone), then
        each of its secret files (-1: gone or unreadable)."""
        return (os.stat(file).st_mtime_ns, *(_changed(p) for p in self._secret_files))

    def _reload(self, *, force: bool) -> None:
        assert self._file is not None
        self._checked = time.monotonic()
        try:
            stamp = self._stamp(self._file)
            if not force and stamp == self._file_stamp:
                return
            parsed = parse_keys_file(self._file.read_text())
            base = self._file.parent
            named = {base / t.secret_file for t in parsed.webhooks.values() if t.secret_file}
            self._secret_files = tuple(sorted(named))
            # Stamped before the secrets are read: one changed meanwhile is
            # read again at the next check.
            stamp = (stamp[0], *(_changed(p) for p in self._secret_files))
            webhooks = _with_secrets(parsed.webhooks, base)
        except FileNotFoundError:
            if force:
                raise SystemExit(f"cannot read the API keys file {self._file}") from None
            # Deleting the file revokes every key in it, once it stays gone
            # for two checks: an editor that saves by renaming leaves it
            # missing for an instant, which must not lock everyone out.
            if self._missing and self._file_keys:
                log.warning("the API keys file %s is gone: its keys are revoked", self._file)
                self._file_keys, self._file_webhooks = {}, {}
            self._missing, self._file_stamp = True, None
            return
        except (OSError, UnicodeDecodeError, KeysFileError) as error:
            reason = error if isinstance(error, KeysFileError) else "cannot read it"
            if force:
                raise SystemExit(f"the API keys file {self._file}: {reason}") from None
            log.warning(
                "the API keys file %s: %s; keeping the keys loaded before", self._file, reason
            )
            self._file_stamp = None if isinstance(error, OSError) else stamp
            self._missing = False
            return
        self._file_keys, self._file_webhooks = parsed.keys, webhooks
        self._file_stamp = stamp
        self._missing = False
        log.info("loaded %d API keys from %s", len(parsed.keys), self._file)


def _changed(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _with_secrets(webhooks: dict[str, WebhookTrust], base: Path) -> dict[str, WebhookTrust]:
    """Each principal's trust with its secret read; KeysFileError naming the
    principal if one cannot be."""
    read: dict[str, WebhookTrust] = {}
    for name, trust in webhooks.items():
        try:
            read[name] = with_secret(trust, base)
        except ValueError as error:
            raise KeysFileError(f"principal {name}'s webhook-secret: {error}") from None
    return read


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The key of an `Authorization: Bearer KEY` header, or ""."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def authenticate(keys: ApiKeys, presented: str) -> Principal:
    """The principal of a public caller's key on a mesh with keys; raises
    Unauthenticated if it is missing or wrong. The one decision the servers'
    interceptor and Envoy's ext_authz check (``runtime.ext_authz``) share."""
    principal = keys.match(presented) if presented else None
    if principal is None:
        raise Unauthenticated(
            "a valid API key is required" if presented else "an API key is required"
        )
    return principal
