"""Public API keys: `Authorization: Bearer KEY`, checked against stored hashes.

Keys come from configuration (plain, hashed at start) and/or a file that is
re-read when it changes (no restart). A file line is a key, or ``sha256:HEX``
for a key stored only as its hash; blank lines and ``#`` comments are skipped.
A key is never logged, never echoed, never a metric label.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

RELOAD_CHECK_SECONDS = 1.0


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, keys: Iterable[str] = (), file: str | None = None) -> None:
        self._static = {key_hash(k) for k in keys if k}
        self._file = Path(file) if file else None
        self._file_hashes: set[bytes] = set()
        self._file_stamp: int | None = None
        self._checked = 0.0
        if self._file is not None:
            self._reload(force=True)

    @property
    def configured(self) -> bool:
        self._maybe_reload()
        return bool(self._static or self._file_hashes or self._file is not None)

    def check(self, presented: str) -> bool:
        return self.match(presented) is not None

    def match(self, presented: str) -> bytes | None:
        """The stored hash the key matches (it names the key in rate limits,
        never the key itself), or None. Constant time per stored key."""
        self._maybe_reload()
        digest = key_hash(presented)
        matched: bytes | None = None
        for stored in (*self._static, *self._file_hashes):
            if hmac.compare_digest(digest, stored):
                matched = stored
        return matched

    def _maybe_reload(self) -> None:
        if self._file is None or time.monotonic() - self._checked < RELOAD_CHECK_SECONDS:
            return
        self._reload(force=False)

    def _reload(self, *, force: bool) -> None:
        assert self._file is not None
        self._checked = time.monotonic()
        try:
            stamp = os.stat(self._file).st_mtime_ns
        except OSError:
            if force:
                raise SystemExit(f"cannot read the API keys file {self._file}") from None
            log.warning("the API keys file %s is gone; keeping the keys loaded before", self._file)
            return
        if not force and stamp == self._file_stamp:
            return
        hashes = set()
        for line in self._file.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("sha256:"):
                hashes.add(bytes.fromhex(line.removeprefix("sha256:")))
            else:
                hashes.add(key_hash(line))
        self._file_hashes = hashes
        self._file_stamp = stamp
        log.info("loaded %d API keys from %s", len(hashes), self._file)


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The key of an `Authorization: Bearer KEY` header, or ""."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""
