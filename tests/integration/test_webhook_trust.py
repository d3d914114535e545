"""Per-tenant webhook trust, end to end: two tenants of a keyed mesh, each
with its own receiver on loopback listed for it alone in the keys file.
Tenant B aiming a session or a turn at A's receiver is a 400 that changes
nothing; each notice names its principal in its signed body (and a header),
A's signed with A's own secret; and a reloaded keys file changes who may
send where, without a restart, while A's receiver still tells B's notice
from its own."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.mesh import Mesh, eventually, start_keyed_mesh
from tests.support.webhooks import SECRET, Receiver, receiving
from turnmesh.client import AsyncClient, InvalidArgumentError

MESH_KEY = "tm-mesh-key-webhook-trust-0123456789"
KEY_A = "tm-key-tenant-a-0123456789abcdef"
KEY_B = "tm-key-tenant-b-0123456789abcdef"
A_SECRET = "whsec_" + base64.b64encode(b"tenant-a's own signing secret!!!").decode()


def _prefix(receiver: Receiver) -> str:
    return receiver.url.rsplit("/", 1)[0] + "/"  # http://127.0.0.1:PORT/


def _keys(a: Receiver, b_may: list[Receiver]) -> str:
    """Tenant A: its receiver and its own secret; tenant B: ``b_may``."""
    b_list = ",".join(_prefix(r) for r in b_may)
    return (
        f"tenant-a\t{KEY_A}\twebhooks={_prefix(a)}\twebhook-secret=a.secret\n"
        f"tenant-b\t{KEY_B}\twebhooks={b_list}\n"
    )


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _whose(receiver: Receiver, index: int, secret: str) -> dict[str, Any]:
    """The receiver's check: the notice verified with the secret it
    expects (raises if it was not signed with it), its principal as signed."""
    headers, body = receiver.seen[index]
    notice: dict[str, Any] = Webhook(secret).verify(body, headers)
    assert headers["webhook-principal"] == notice["principal"]
    return notice


async def test_a_tenant_cannot_aim_notices_at_anothers_receiver_and_each_names_its_own(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    mesh = mesh_factory
    (tmp_path / "a.secret").write_text(A_SECRET + "\n")
    mesh_secret = tmp_path / "mesh.secret"
    mesh_secret.write_text(SECRET + "\n")
    async with receiving() as hooks_a, receiving() as hooks_b:
        keys = tmp_path / "api-keys"
        keys.write_text(_keys(hooks_a, [hooks_b]))
        flags = ("--webhook-secret-file", str(mesh_secret), "--webhook-retry-seconds", "0.05")
        servers = start_keyed_mesh(mesh, keys, MESH_KEY, servers=1, server_flags=flags)
        edge = mesh.start_envoy(servers).listener_address
        async with httpx.AsyncClient(base_url=f"http://{edge}", timeout=60) as rest:
            # B names A's receiver for a new session: 400, no session made.
            refused = await rest.post(
                "/v1/sessions",
                json={"sessionId": "b-1", "webhookUrl": hooks_a.url},
                headers=_as(KEY_B),
            )
            assert refused.status_code == 400, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            (violation,) = refused.json()["violations"]
            assert violation["field"] == "webhook_url"
            assert "your key's allow-list" in violation["description"]
            assert (await rest.get("/v1/sessions/b-1", headers=_as(KEY_B))).status_code == 404
            # ... or for a turn of its own session: 400, nothing runs.
            made = await rest.post("/v1/sessions", json={"sessionId": "b-2"}, headers=_as(KEY_B))
            assert made.status_code == 200, made.text
            turn = await rest.post(
                "/v1/sessions/b-2/turns:start",
                json={"message": "hi", "webhookUrl": hooks_a.url},
                headers=_as(KEY_B),
            )
            assert turn.status_code == 400, turn.text
            assert [v["field"] for v in turn.json()["violations"]] == ["turn.webhook_url"]
            history = await rest.get("/v1/sessions/b-2/history", headers=_as(KEY_B))
            assert history.json().get("messages", []) == []
            listed = (await rest.get("/v1/sessions", headers=_as(KEY_B))).json()["sessions"]
            assert [s["sessionId"] for s in listed] == ["b-2"]

        # Each tenant's turn reaches its own receiver, named and signed as its own.
        async with AsyncClient(edge, api_key=KEY_A) as a, AsyncClient(edge, api_key=KEY_B) as b:
            sid_a = (await a.create_session("same-id", webhook_url=hooks_a.url)).session_id
            await a.send(sid_a, "hello from a")
            sid_b = (await b.create_session("same-id", webhook_url=hooks_b.url)).session_id
            await b.send(sid_b, "hello from b")
        await hooks_a.requests(1)
        await hooks_b.requests(1)
        mine = _whose(hooks_a, 0, A_SECRET)
        assert (mine["principal"], mine["data"]["sessionId"]) == ("tenant-a", "same-id")
        with pytest.raises(WebhookVerificationError):  # A's own secret signs A's notices
            Webhook(SECRET).verify(hooks_a.seen[0][1], hooks_a.seen[0][0])
        assert _whose(hooks_b, 0, SECRET)["principal"] == "tenant-b"

        # The operator lists A's receiver for B too (a reload, no restart):
        # B's notice now reaches it, and A's check tells it is not A's.
        keys.write_text(_keys(hooks_a, [hooks_b, hooks_a]))
        stamp = os.stat(keys).st_mtime_ns + 1_000_000_000  # a change however coarse the clock
        os.utime(keys, ns=(stamp, stamp))
        async with AsyncClient(edge, api_key=KEY_B) as b:

            async def b_may_use_as_receiver() -> bool:
                try:
                    await b.create_session("b-3", webhook_url=hooks_a.url)
                except InvalidArgumentError:
                    return False
                return True

            await eventually(b_may_use_as_receiver, what="the reloaded keys file")
            await b.send("b-3", "hello again")
        await hooks_a.requests(2)
        headers, body = hooks_a.seen[1]
        with pytest.raises(WebhookVerificationError):
            Webhook(A_SECRET).verify(body, headers)
        theirs = _whose(hooks_a, 1, SECRET)
        assert theirs["principal"] == "tenant-b" != mine["principal"]
        assert json.loads(body)["data"]["sessionId"] == "b-3"
