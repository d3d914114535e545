"""Principals: who a call acts for, and the session ids each one owns.

Every API key names a principal (``runtime.auth``); without keys every call
is the anonymous principal's. The API-key interceptor sets the caller's
principal for the call (``current``); a mesh member forwarding a call names it
in ``x-turnmesh-principal``, which is believed only beside the mesh key
(Envoy strips it from outside calls).

Session ids are per principal. Inside the mesh (routes, stores, workers,
logs) a session is known by its *scoped* id: ``PRINCIPAL/ID``, or the bare
``ID`` for the anonymous principal (so a keyless mesh's ids are what they
always were). Principal names and public ids never contain ``/``, so the
scoped id is injective; callers only ever see the public ``ID``.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass

ANONYMOUS = "anonymous"
# No "/" (the scoped-id separator) and no whitespace (the header's separator).
PRINCIPAL_PATTERN = re.compile(r"[A-Za-z0-9._@-]{1,64}")
SCOPED_ID_PATTERN = re.compile(r"(?:[A-Za-z0-9._@-]{1,64}/)?[A-Za-z0-9._:-]{1,128}")
PRINCIPAL_METADATA = "x-turnmesh-principal"
ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    # May read (never change) any principal's sessions, each access logged.
    admin: bool = False

    def header(self) -> str:
        return f"{self.name} {ADMIN}" if self.admin else self.name

    @classmethod
    def from_header(cls, value: str) -> Principal | None:
        name, _, role = value.partition(" ")
        if not PRINCIPAL_PATTERN.fullmatch(name) or role not in ("", ADMIN):
            return None
        return cls(name, admin=role == ADMIN)


ANONYMOUS_PRINCIPAL = Principal(ANONYMOUS)

# Set by the API-key interceptor for every call it lets through; no default,
# so code that reads it outside a call fails rather than acts for nobody.
_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("turnmesh_principal")


def current() -> Principal:
    return _current.get()


# Whether the current call's caller proved who it is (a valid API key, or a
# mesh member's key), or the mesh has no keys to prove it with: what an open
# method (health) may show beyond its status.
_known: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "turnmesh_caller_known", default=False
)


def caller_known() -> bool:
    return _known.get()


def set_caller_known(known: bool) -> None:
    _known.set(known)


def set_current(principal: Principal) -> None:
    _current.set(principal)


def scoped(principal: str, public_id: str) -> str:
    return public_id if principal == ANONYMOUS else f"{principal}/{public_id}"


def public_id(scoped_id: str) -> str:
    return scoped_id.rpartition("/")[2]


def principal_of(scoped_id: str) -> str:
    head, slash, _ = scoped_id.partition("/")
    return head if slash else ANONYMOUS
