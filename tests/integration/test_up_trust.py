"""Trust in `turnmesh up`: the mesh always has a key, which no command line
shows, and a public host needs API keys (or an explicit --allow-open)."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from tests.support.up import UpProcess, clean_env
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

GIVEN_KEY = "a-mesh-key-given-by-the-operator-0123456789"
API_KEY = "public-api-key-0123456789"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.parametrize("key", ["generated", "given"])
def test_the_mesh_key_reaches_members_by_environment_only(tmp_path: Path, key: str) -> None:
    env = clean_env()
    if key == "given":
        env["TURNMESH_MESH_KEY"] = GIVEN_KEY
    run_dir = tmp_path / "run"
    with UpProcess(run_dir, "--port", "0", env=env) as up:
        up.banner()
        status = up.status()
        members = [name for name in status if name != "envoy"]
        assert members == ["router", "worker-1", "server-1"]
        (mesh_key,) = {_environ(status[m]["pid"])["TURNMESH_MESH_KEY"] for m in members}
        if key == "given":
            assert mesh_key == GIVEN_KEY
        else:
            assert len(mesh_key) >= 40  # secrets.token_urlsafe(32)
        # Envoy calls only the public API: it never gets the key.
        assert "TURNMESH_MESH_KEY" not in _environ(status["envoy"]["pid"])
        # /proc/PID/cmdline is world-readable: the key is on none, nor in a file
        # of the run directory (logs, Envoy's config, the status file).
        for pid in (up.proc.pid, *(c["pid"] for c in status.values())):
            assert mesh_key not in _cmdline(pid)
        for path in run_dir.iterdir():
            assert mesh_key not in path.read_text(errors="replace"), path

        # A process that is not a member may not join: the router refuses it.
        with grpc.insecure_channel(status["router"]["address"]) as channel:
            router = RouterServiceStub(channel)
            rogue = rpb.Member(
                member_id="rogue", role=rpb.MEMBER_ROLE_WORKER, address="127.0.0.1:1"
            )
            for metadata in ((), (("x-turnmesh-mesh-key", "guessed"),)):
                with pytest.raises(grpc.RpcError) as refused:
                    router.Register(rpb.RegisterRequest(member=rogue), metadata=metadata,
                                    timeout=30)  # fmt: skip
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # The key the members hold is the one the router checks.
            router.RemoveSession(
                rpb.RemoveSessionRequest(session_id="nobody"),
                metadata=(("x-turnmesh-mesh-key", mesh_key),),
                timeout=30,
            )


def test_up_refuses_a_public_host_without_api_keys(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up = UpProcess(run_dir, "--host", "0.0.0.0", "--port", "0")
    try:
        assert up.wait_exit() == 2
        assert up.text().strip() == (
            "turnmesh up: refusing to serve on 0.0.0.0 without API keys: pass --api-keys-file "
            "FILE (or set TURNMESH_API_KEYS), or --allow-open to expose an unauthenticated API"
        )
        assert not run_dir.exists()  # refused before anything started
    finally:
        up.close()


@pytest.mark.parametrize("opened_by", ["api-keys", "allow-open"])
def test_up_serves_a_public_host_with_api_keys_or_allow_open(
    tmp_path: Path, opened_by: str
) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text(API_KEY + "\n")
    flag = ["--api-keys-file", str(keys)] if opened_by == "api-keys" else ["--allow-open"]
    with UpProcess(tmp_path / "run", "--host", "0.0.0.0", "--port", "0", *flag) as up:
        edge = up.edge()
        assert up.status()["envoy"]["address"].startswith("0.0.0.0:")
        with httpx.Client(base_url=f"http://{edge}", timeout=60) as rest:
            anonymous = rest.post("/v1/sessions", json={})
            assert anonymous.status_code == (401 if opened_by == "api-keys" else 200)
            keyed = rest.post(
                "/v1/sessions", json={}, headers={"Authorization": f"Bearer {API_KEY}"}
            )
            assert keyed.status_code == 200
