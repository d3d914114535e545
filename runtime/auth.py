"""Public API keys: `Authorization: Bearer KEY`, checked against stored hashes.

Keys come from configuration (plain, hashed at start) and/or a file that is
re-read when it changes (no restart). Each key names a principal
(``runtime.principals``): the sessions it creates are that principal's. A file
line is one of::

    KEY                           principal key-<first 16 hex of sha256(KEY)>
    sha256:HEX                    the same key stored only as its hash
    NAME<TAB>KEY[<TAB>admin]      principal NAME (several keys may share one)
    NAME<TAB>sha256:HEX[<TAB>admin]

so ``KEY`` and ``sha256:`` of it name the same principal, and a line without a
tab means what it always did (a key holding a tab would now read as a name).
Blank lines and ``#`` comments are skipped. A malformed line refuses the file
at start, and keeps the keys loaded before on a reload; the message names the
line's number, never its text. Deleting the file revokes its keys (once it is
still gone at the next check, a second later). A key is never logged, echoed or a metric label.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from turnmesh.runtime.errors import Unauthenticated
from turnmesh.runtime.principals import ADMIN, ANONYMOUS, PRINCIPAL_PATTERN, Principal

log = logging.getLogger(__name__)

RELOAD_CHECK_SECONDS = 1.0


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def derived_principal(digest: bytes) -> Principal:
    """The principal of a key given without a name: from its hash."""
    return Principal(f"key-{digest.hex()[:16]}")


class KeysFileError(ValueError):
    """A line of the keys file that is not a key (its number, not its text)."""


def parse_keys(text: str) -> dict[bytes, Principal]:
    keys: dict[bytes, Principal] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        try:
            if len(fields) == 1:
                digest = _digest(fields[0])
                keys[digest] = derived_principal(digest)
                continue
            if len(fields) not in (2, 3) or (len(fields) == 3 and fields[2].strip() != ADMIN):
                raise ValueError("expected NAME<TAB>KEY or NAME<TAB>KEY<TAB>admin")
            name = fields[0].strip()
            if not PRINCIPAL_PATTERN.fullmatch(name) or name == ANONYMOUS:
                raise ValueError(
                    "a principal is 1-64 characters of A-Z a-z 0-9 . _ @ - (not 'anonymous')"
                )
            keys[_digest(fields[1].strip())] = Principal(name, admin=len(fields) == 3)
        except ValueError as error:
            raise KeysFileError(f"line {number}: {error}") from None
    return keys


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
        self._file_stamp: int | None = None
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

    def _maybe_reload(self) -> None:
        if self._file is None or time.monotonic() - self._checked < RELOAD_CHECK_SECONDS:
            return
        self._reload(force=False)

    def _reload(self, *, force: bool) -> None:
        assert self._file is not None
        self._checked = time.monotonic()
        try:
            stamp = os.stat(self._file).st_mtime_ns
            if not force and stamp == self._file_stamp:
                return
            keys = parse_keys(self._file.read_text())
        except FileNotFoundError:
            if force:
                raise SystemExit(f"cannot read the API keys file {self._file}") from None
            # Deleting the file revokes every key in it, once it stays gone
            # for two checks: an editor that saves by renaming leaves it
            # missing for an instant, which must not lock everyone out.
            if self._missing and self._file_keys:
                log.warning("the API keys file %s is gone: its keys are revoked", self._file)
                self._file_keys = {}
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
        self._file_keys = keys
        self._file_stamp = stamp
        self._missing = False
        log.info("loaded %d API keys from %s", len(keys), self._file)


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
