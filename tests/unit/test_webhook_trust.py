"""Per-principal webhook trust: the keys file's ``webhooks=`` and
``webhook-secret=`` options (parsed, joined across a principal's lines,
reloaded with the file or its secret files), and the sender that applies
them: where each principal's webhooks may go, the principal named in each
notice's signed body and header, the secret that signs it, and notices queued
before any of this still delivered."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.webhooks import SECRET, receiving
from turnmesh.runtime.auth import ApiKeys, KeysFileError, parse_keys_file
from turnmesh.runtime.errors import InvalidArgument
from turnmesh.runtime.principals import Principal
from turnmesh.runtime.webhook_trust import DEFAULT_TRUST, WebhookTrust
from turnmesh.server.webhooks.outbox import Delivery, MemoryOutbox
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.webhooks.settings import WebhookSettings, settings_from

ACME_SECRET = "whsec_" + base64.b64encode(b"acme's own webhook signing key!!").decode()


def _touch(path: Path, step: int) -> None:
    """A change of the file's time however coarse the filesystem's clock."""
    stamp = os.stat(path).st_mtime_ns + step * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def test_options_name_a_principals_destinations_and_secret_across_its_lines() -> None:
    parsed = parse_keys_file(
        "acme\tk1\twebhooks=https://a.example/hooks/, https://b.example\twebhook-secret=a.key\n"
        "acme\tk2\tadmin\twebhooks=https://c.example,https://a.example/hooks/\n"
        "acme\tk3\n"
        "beta\tk4\n"
        "mute\tk5\twebhooks=\n"
        "bare-key\n"
    )
    assert len(parsed.keys) == 6
    assert set(parsed.keys.values()) >= {Principal("acme", admin=True), Principal("beta")}
    assert parsed.webhooks == {
        "acme": WebhookTrust(
            ("https://a.example/hooks/", "https://b.example", "https://c.example"), "a.key"
        ),
        "mute": WebhookTrust(()),  # a list of its own, empty: no webhooks for it
    }
    assert "beta" not in parsed.webhooks  # the server's list and secret


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("acme\tS3CRET\twebhooks=ftp://x.example", "webhooks=: item 1"),
        ("acme\tS3CRET\twebhooks=https://ok.example,not a url", "webhooks=: item 2"),
        ("acme\tS3CRET\twebhooks=https://a.example\twebhooks=https://b.example", "at most one"),
        ("acme\tS3CRET\twebhooks", "at most one"),
        ("acme\tS3CRET\tadmin=yes", "at most one"),
        ("acme\tS3CRET\twebhook-secret=", "names no file"),
        ("acme\tk1\twebhook-secret=a.key\nacme\tS3CRET\twebhook-secret=b.key", "another"),
    ],
)
def test_a_bad_option_names_its_line_never_its_text(text: str, why: str) -> None:
    with pytest.raises(KeysFileError) as raised:
        parse_keys_file(f"good-key\n{text}\n")
    message = str(raised.value)
    assert message.startswith(f"line {1 + text.count(chr(10)) + 1}:") and why in message
    assert "S3CRET" not in message and "x.example" not in message


def test_secret_files_are_read_with_the_keys_and_reloaded_when_they_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys"
    secret = tmp_path / "acme.secret"
    path.write_text("acme\tk1\twebhooks=https://a.example\twebhook-secret=acme.secret\n")
    with pytest.raises(SystemExit, match="principal acme's webhook-secret"):
        ApiKeys(file=str(path))  # its secret file missing: refused at start
    secret.write_text("whsec_\n")  # decodes to no key
    with pytest.raises(SystemExit, match="not a Standard Webhooks secret"):
        ApiKeys(file=str(path))
    secret.write_text(ACME_SECRET + "\n")
    keys = ApiKeys(file=str(path))
    assert keys.webhook_trust("acme").secret == ACME_SECRET
    assert keys.webhook_trust("acme").allow == ("https://a.example",)
    assert keys.webhook_trust("beta") == DEFAULT_TRUST
    assert keys.webhook_principals() == {"acme"}

    monkeypatch.setattr("turnmesh.runtime.auth.RELOAD_CHECK_SECONDS", 0.0)
    # The secret file alone rotated: read again at the next check.
    secret.write_text(SECRET + "\n")
    _touch(secret, 1)
    assert keys.webhook_trust("acme").secret == SECRET
    # A bad one keeps what was loaded before; fixed, it is read.
    secret.write_text("whsec_!!!\n")
    _touch(secret, 2)
    assert keys.webhook_trust("acme").secret == SECRET
    assert keys.match("k1") == Principal("acme")
    secret.write_text(ACME_SECRET + "\n")
    _touch(secret, 3)
    assert keys.webhook_trust("acme").secret == ACME_SECRET
    # The keys file changed: its options with it.
    path.write_text("acme\tk1\n")
    _touch(path, 4)
    assert keys.webhook_trust("acme") == DEFAULT_TRUST


def test_the_servers_secret_turns_webhooks_on_and_its_list_is_the_default(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    on = settings_from(None, str(secret))  # a secret alone: principals' own lists only
    assert on.allow == () and on.secret == SECRET
    assert settings_from("http://a.example, http://b.example/x", str(secret)).allow == (
        "http://a.example",
        "http://b.example/x",
    )
    with pytest.raises(ValueError, match="--webhook-allow: item 2"):
        settings_from("http://a.example,ftp://b.example", str(secret))
    with pytest.raises(ValueError, match="needs --webhook-secret-file"):
        settings_from("http://a.example", None)
    secret.write_text("whsec_==\n")
    with pytest.raises(ValueError, match="--webhook-secret-file: not a Standard Webhooks"):
        settings_from(None, str(secret))
    assert not WebhookSender(WebhookSettings(), MemoryOutbox()).enabled


class EmptiedOutbox(MemoryOutbox):
    """Says when it holds nothing more (every notice delivered or given up)."""

    def __init__(self) -> None:
        super().__init__()
        self.empty = asyncio.Event()

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        await super().settle(delivery, retry_at)
        if await self.next_due() is None:
            self.empty.set()


class Trusts:
    """A keys file's webhook trust, as the sender asks for it."""

    def __init__(self, trusts: dict[str, WebhookTrust]) -> None:
        self.trusts = trusts

    def webhook_trust(self, principal: str) -> WebhookTrust:
        return self.trusts.get(principal, DEFAULT_TRUST)


def test_each_principal_may_send_only_where_its_own_list_or_the_servers_says() -> None:
    trusts = Trusts(
        {
            "acme": WebhookTrust(("https://acme.example/hooks",)),
            "mute": WebhookTrust(()),
        }
    )
    settings = WebhookSettings(allow=("https://shared.example",), secret=SECRET)
    sender = WebhookSender(settings, MemoryOutbox(), trust=trusts)
    acme, shared = "https://acme.example/hooks/in", "https://shared.example/in"
    assert sender.allows("acme", acme) and not sender.allows("acme", shared)
    assert sender.allows("beta", shared) and not sender.allows("beta", acme)
    sender.check("acme", acme, "webhook_url")
    with pytest.raises(InvalidArgument) as refused:
        sender.check("beta", acme, "webhook_url")
    assert "see its allow-list" in refused.value.detail
    with pytest.raises(InvalidArgument) as refused:
        sender.check("acme", shared, "webhook_url")
    assert "your key's allow-list" in refused.value.detail
    with pytest.raises(InvalidArgument, match="your key's allow-list is empty"):
        sender.check("mute", shared, "webhook_url")
    # Dressed-up URLs are refused against a principal's list as against the server's.
    with pytest.raises(InvalidArgument):
        sender.check("acme", "https://acme.example/hooks/../admin", "webhook_url")
    # A reload that takes a URL off a list applies at once.
    trusts.trusts["acme"] = WebhookTrust(("https://acme.example/other",))
    assert not sender.allows("acme", acme)


async def test_a_notice_names_its_principal_signed_with_its_own_secret_or_the_servers() -> None:
    async with receiving() as receiver:
        outbox = MemoryOutbox()
        trusts = Trusts({"acme": WebhookTrust((receiver.url,), "acme.secret", ACME_SECRET)})
        settings = WebhookSettings(allow=(receiver.url,), secret=SECRET, first_retry_seconds=0.01)
        sender = WebhookSender(settings, outbox, trust=trusts)
        sender.start()
        try:
            await sender.send(receiver.url, "turn.finished", {"sessionId": "s"}, owner="acme")
            await receiver.requests(1)
            await sender.send(receiver.url, "turn.finished", {"sessionId": "s"}, owner="beta")
            await receiver.requests(2)
        finally:
            await sender.stop()
    (acme_headers, acme_body), (beta_headers, beta_body) = receiver.seen
    acme = Webhook(ACME_SECRET).verify(acme_body, acme_headers)
    assert acme["principal"] == acme_headers["webhook-principal"] == "acme"
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(acme_body, acme_headers)
    beta = Webhook(SECRET).verify(beta_body, beta_headers)
    assert beta["principal"] == beta_headers["webhook-principal"] == "beta"
    assert list(beta) == ["type", "timestamp", "principal", "data"]
    # The principal is in what is signed: a body that names another fails.
    forged = beta_body.replace(b'"principal":"beta"', b'"principal":"acme"')
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(forged, beta_headers)


async def test_a_queued_notice_goes_nowhere_its_principals_list_no_longer_admits() -> None:
    async with receiving() as receiver:
        outbox = EmptiedOutbox()
        trusts = Trusts({"acme": WebhookTrust((receiver.url,))})
        settings = WebhookSettings(secret=SECRET, max_attempts=2, first_retry_seconds=0.01)
        sender = WebhookSender(settings, outbox, trust=trusts)
        await sender.send(receiver.url, "turn.finished", {}, owner="acme")
        trusts.trusts["acme"] = WebhookTrust(())  # reloaded before it was sent
        sender.start()
        try:
            await asyncio.wait_for(outbox.empty.wait(), 60)  # given up after its attempts
        finally:
            await sender.stop()
    assert receiver.seen == []


async def test_notices_queued_before_principals_were_named_are_still_delivered() -> None:
    """An outbox (SQLite's, Redis') may hold notices an older server queued:
    a body without ``principal``, and before owners, no owner. They go out
    under the server's list and secret, signed as before."""
    async with receiving() as receiver:
        outbox = MemoryOutbox()
        old_body = b'{"type":"turn.finished","timestamp":"2026-01-01T00:00:00.000Z","data":{}}'
        await outbox.add(Delivery("msg_old", receiver.url, old_body, owner="acme"), 10)
        await outbox.add(Delivery("msg_older", receiver.url, old_body), 10)
        settings = WebhookSettings(allow=(receiver.url,), secret=SECRET)
        sender = WebhookSender(settings, outbox)
        sender.start()
        try:
            await receiver.requests(2)
        finally:
            await sender.stop()
    by_id = {headers["webhook-id"]: (headers, body) for headers, body in receiver.seen}
    for headers, body in by_id.values():
        assert body == old_body
        assert Webhook(SECRET).verify(body, headers) == json.loads(old_body)
    assert by_id["msg_old"][0]["webhook-principal"] == "acme"
    assert "webhook-principal" not in by_id["msg_older"][0]
