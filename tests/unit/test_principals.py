"""Principals: the keys file's forms, the principal a call acts for, scoped
session ids, and keyset listing pages merged across sources."""

from __future__ import annotations

import base64
import hashlib
import itertools
import random
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from turnmesh.runtime import principals
from turnmesh.runtime.auth import ApiKeys, KeysFileError, parse_keys
from turnmesh.runtime.errors import InvalidArgument
from turnmesh.runtime.handlers import MethodHandler
from turnmesh.runtime.interceptors import MESH_KEY_METADATA, ApiKeyInterceptor
from turnmesh.runtime.principals import (
    ANONYMOUS,
    PRINCIPAL_METADATA,
    SCOPED_ID_PATTERN,
    Principal,
    principal_of,
    public_id,
    scoped,
)
from turnmesh.runtime.ratelimit import TokenBuckets
from turnmesh.server.stores import listing
from turnmesh.server.stores.listing import Page, merge


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_a_bare_key_and_its_hash_name_the_same_principal() -> None:
    keys = parse_keys(f"plain:key=with-colons\nsha256:{_sha('plain:key=with-colons')}\n")
    assert len(keys) == 1
    (principal,) = keys.values()
    assert principal == Principal(f"key-{_sha('plain:key=with-colons')[:16]}")


def test_named_keys_admin_role_comments_and_rotation() -> None:
    text = (
        "# tenants\n"
        "\n"
        "acme\tacme-old\n"
        "acme\tacme-new\n"
        f"ops@corp\tsha256:{_sha('ops-key')}\tadmin\n"
        "legacy-bare-key\n"
    )
    keys = parse_keys(text)
    by_key = {k: keys[hashlib.sha256(k.encode()).digest()] for k in ("acme-old", "acme-new")}
    assert by_key == {"acme-old": Principal("acme"), "acme-new": Principal("acme")}
    assert keys[hashlib.sha256(b"ops-key").digest()] == Principal("ops@corp", admin=True)
    assert len(keys) == 4


@pytest.mark.parametrize(
    "line",
    [
        "acme\tS3CRET\tsuperuser",  # unknown role
        "anonymous\tS3CRET",  # reserved
        "ac/me\tS3CRET",  # the scoped-id separator
        "acme\tsha256:S3CRET",
        "acme\tsha256:abcd",  # too short
        "acme\t\tadmin",  # no key
        "a\tS3CRET\tadmin\textra",
    ],
)
def test_a_malformed_line_names_its_number_never_its_text(line: str) -> None:
    with pytest.raises(KeysFileError) as raised:
        parse_keys(f"good-key\n{line}\n")
    assert str(raised.value).startswith("line 2:")
    assert "S3CRET" not in str(raised.value)


def test_a_bad_reload_keeps_the_keys_loaded_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys"
    path.write_text("acme\tk1\n")
    keys = ApiKeys(file=str(path))
    assert keys.match("k1") == Principal("acme")
    path.write_text("acme\tk1\nbroken\tsha256:zz\n")
    monkeypatch.setattr("turnmesh.runtime.auth.RELOAD_CHECK_SECONDS", 0.0)
    assert keys.match("k1") == Principal("acme")  # still served, the bad file logged
    path.write_text("beta\tk2\n")
    assert keys.match("k1") is None and keys.match("k2") == Principal("beta")
    # Deleted: revoked once it is still gone at the next check (an editor's
    # save-by-rename leaves it missing for an instant only).
    path.unlink()
    assert keys.match("k2") == Principal("beta")
    assert keys.match("k2") is None
    assert keys.configured  # keys are still required: nobody gets in
    path.write_text("beta\tk2\n")
    assert keys.match("k2") == Principal("beta")
    path.write_text("x\tsha256:zz\n")
    with pytest.raises(SystemExit, match="line 1"):
        ApiKeys(file=str(path))


def test_scoped_ids_are_injective_and_round_trip() -> None:
    names = [ANONYMOUS, "acme", "a.b@c", "key-0123456789abcdef"]
    ids = ["my-thread", "a:b", "x", "acme"]
    seen = {}
    for name, sid in itertools.product(names, ids):
        s = scoped(name, sid)
        assert SCOPED_ID_PATTERN.fullmatch(s)
        assert (principal_of(s), public_id(s)) == (name, sid)
        assert s not in seen
        seen[s] = (name, sid)
    assert scoped(ANONYMOUS, "my-thread") == "my-thread"  # a keyless mesh's ids are unchanged


def test_the_principal_header_round_trips_and_refuses_junk() -> None:
    for p in (Principal("acme"), Principal("ops", admin=True)):
        assert Principal.from_header(p.header()) == p
    for junk in ("", "a/b", "acme root", "acme admin extra", "x" * 65):
        assert Principal.from_header(junk) is None


class _Aborted(Exception):
    pass


class _Context:
    code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str, trailers: Any) -> None:
        self.code = code
        raise _Aborted


async def _principal_of_call(
    interceptor: ApiKeyInterceptor, metadata: tuple[tuple[str, str], ...]
) -> Principal | grpc.StatusCode | None:
    """The principal the handler sees, or the status the call was refused with."""
    seen: list[Principal] = []

    async def handler(request: Any, context: Any) -> None:
        seen.append(principals.current())

    async def continuation(details: grpc.HandlerCallDetails) -> MethodHandler:
        return grpc.unary_unary_rpc_method_handler(handler)

    details: Any = type("D", (), {"method": "/x.Y/Z", "invocation_metadata": metadata})()
    wrapped = await interceptor.intercept_service(continuation, details)
    assert wrapped is not None
    # A refusal takes the request as a stream (it never reads it).
    behaviour: Any = wrapped.unary_unary or wrapped.stream_unary
    assert behaviour is not None
    context = _Context()
    try:
        await behaviour(None, cast(Any, context))
    except _Aborted:
        return context.code
    return seen[0]


async def test_the_call_acts_for_its_keys_principal_and_only_members_may_name_one() -> None:
    keys = ApiKeys(["bare"], None)
    interceptor = ApiKeyInterceptor(keys, frozenset(), "mesh")
    bare = Principal(f"key-{_sha('bare')[:16]}")
    forged = ((PRINCIPAL_METADATA, "victim admin"),)
    assert await _principal_of_call(interceptor, (("authorization", "Bearer bare"),)) == bare
    # A client naming a principal is not believed: its key decides.
    assert await _principal_of_call(interceptor, (("authorization", "Bearer bare"), *forged)) == (
        bare
    )
    assert await _principal_of_call(interceptor, forged) == grpc.StatusCode.UNAUTHENTICATED
    wrong_key = ((MESH_KEY_METADATA, "guess"), *forged)
    assert await _principal_of_call(interceptor, wrong_key) == grpc.StatusCode.UNAUTHENTICATED
    # A mesh member names the principal it acts for.
    assert await _principal_of_call(interceptor, ((MESH_KEY_METADATA, "mesh"), *forged)) == (
        Principal("victim", admin=True)
    )
    # With keys, a member's call that names nobody is refused, never anonymous.
    assert await _principal_of_call(interceptor, ((MESH_KEY_METADATA, "mesh"),)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    bad = ((MESH_KEY_METADATA, "mesh"), (PRINCIPAL_METADATA, "a/b"))
    assert await _principal_of_call(interceptor, bad) == grpc.StatusCode.UNAUTHENTICATED


async def test_without_keys_every_caller_is_anonymous_whatever_it_claims() -> None:
    interceptor = ApiKeyInterceptor(ApiKeys(), frozenset(), None)
    forged = ((PRINCIPAL_METADATA, "victim"),)
    assert await _principal_of_call(interceptor, forged) == principals.ANONYMOUS_PRINCIPAL
    # The header that once let a server's own surfaces name a principal is
    # gone: they call the service in-process now.
    former = (("x-turnmesh-internal", "inner"), *forged)
    assert await _principal_of_call(interceptor, former) == principals.ANONYMOUS_PRINCIPAL


async def test_request_rates_are_per_principal() -> None:
    keys = ApiKeys([], None)
    keys._static = {  # two keys of one principal share its rate
        hashlib.sha256(b"k1").digest(): Principal("acme"),
        hashlib.sha256(b"k2").digest(): Principal("acme"),
        hashlib.sha256(b"k3").digest(): Principal("beta"),
    }
    interceptor = ApiKeyInterceptor(
        keys, frozenset(), None, rate_limit=TokenBuckets(1, clock=lambda: 0.0)
    )
    assert await _principal_of_call(interceptor, (("authorization", "Bearer k1"),)) == (
        Principal("acme")
    )
    limited = await _principal_of_call(interceptor, (("authorization", "Bearer k2"),))
    assert limited == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await _principal_of_call(interceptor, (("authorization", "Bearer k3"),)) == (
        Principal("beta")
    )


def _source(
    positions: list[listing.Position], size: int, before: listing.Position | None
) -> Page[str]:
    below = sorted((p for p in positions if before is None or p < before), reverse=True)
    chosen = below[:size]
    return Page([(p, p[1]) for p in chosen], chosen[-1] if len(below) > size else None)


@pytest.mark.parametrize("seed", range(20))
def test_merged_pages_list_every_item_once_in_order(seed: int) -> None:
    rng = random.Random(seed)
    sources = [
        [(rng.randrange(50), f"s{n}-{i}") for i in range(rng.randrange(0, 30))] for n in range(3)
    ]
    everything = sorted((p for s in sources for p in s), reverse=True)
    size = rng.randrange(1, 8)
    listed: list[str] = []
    before = None
    for _ in range(200):
        page = merge([_source(s, size, before) for s in sources], size)
        assert len(page.items) <= size
        listed += [item for _, item in page.items]
        if page.frontier is None:
            break
        before = page.frontier
    assert listed == [p[1] for p in everything]


def test_page_tokens_are_opaque_and_checked() -> None:
    at = (1_700_000_000_123_456_789, "my-thread")
    assert listing.decode_token(listing.encode_token(at)) == at
    assert listing.encode_token(None) == "" and listing.decode_token("") is None
    outside = [listing.encode_token((n, "x")) for n in (-1, 2**63)]  # beyond 64-bit stores
    for junk in ("!!!", "e30", "WzEsMl0", "WyJ4IiwieSJd", *outside):  # {}, [1,2], ["x","y"]
        with pytest.raises(InvalidArgument):
            listing.decode_token(junk)
    # The longest a token gets, and crafted ones: nested past the parser's
    # recursion limit (short enough to be read), long ones, huge numbers.
    longest = listing.encode_token((2**63 - 1, "x" * 128))
    assert listing.decode_token(longest) == (2**63 - 1, "x" * 128)
    nested = base64.urlsafe_b64encode(b"[" * 300).decode()
    deep = base64.urlsafe_b64encode(b"[" * 3000).decode()
    digits = base64.urlsafe_b64encode(b"[" + b"9" * 5000 + b',"x"]').decode()
    for crafted in (nested, deep, digits):
        with pytest.raises(InvalidArgument) as refused:
            listing.decode_token(crafted)
        assert refused.value.violations[0].field == "page_token"


def test_filters_match_strings_and_json_text() -> None:
    wanted = listing.filters("demo", ["team=red", "priority=3", "vip=true", "empty="])
    meta = {"team": "red", "priority": 3, "vip": True, "empty": ""}
    assert wanted.match("demo", meta)
    assert not wanted.match("echo", meta)
    assert not wanted.match("demo", {**meta, "priority": "4"})
    assert not wanted.match("demo", {k: v for k, v in meta.items() if k != "vip"})
    with pytest.raises(InvalidArgument):
        listing.filters("", ["novalue"])
    with pytest.raises(InvalidArgument):
        listing.page_size(101)
    assert listing.page_size(0) == listing.DEFAULT_PAGE_SIZE
