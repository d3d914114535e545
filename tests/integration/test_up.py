"""`turnmesh up` (what `make run` starts), end to end as a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from websockets.sync.client import connect as ws_connect

from tests.support.certs import TestCA
from tests.support.collector import Collector
from tests.support.mesh import RedisServer, wait_for
from tests.support.up import UpProcess, clean_env, processes_mentioning
from turnmesh.client import Client
from turnmesh.runtime.interceptors import MESH_KEY_METADATA
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub


def _status_pids(run_dir: Path) -> dict[str, int]:
    document = json.loads((run_dir / "status.json").read_text())
    return {c["name"]: c["pid"] for c in document["components"]}


def _up(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "turnmesh", "up", "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )


def test_up_serves_rest_and_grpc_and_stops_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _up(run_dir, "--port", "0", "--servers", "2", "--workers", "2", "--log-level", "INFO")
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops the mesh."):
                break
        banner = "".join(lines)
        # Keep reading the console so `up` never blocks on a full pipe.
        threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True).start()
        match = re.search(r"REST/SSE and gRPC\s+http://(\S+)", banner)
        assert match, banner
        edge = match.group(1)
        assert "curl " in banner
        assert "grpcurl " in banner
        assert f"playground         http://{edge}/" in banner

        # REST through Envoy, as the banner's curl does.
        with httpx.Client(base_url=f"http://{edge}", timeout=30) as rest:
            page = rest.get("/")
            assert page.status_code == 200
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert "<title>turnmesh playground</title>" in page.text
            created = rest.post("/v1/sessions", json={"sessionId": "hello"})
            assert created.status_code == 200
            with rest.stream(
                "POST", "/v1/sessions/hello/turns", json={"message": "What is 6*7?"}
            ) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                frames = [
                    json.loads(line[len("data: ") :])
                    for line in response.iter_lines()
                    if line.startswith("data: ")
                ]
            assert frames[-1]["type"] == "RUN_FINISHED"
        # Native gRPC through the same port, with the sync client.
        with Client(edge) as client:
            assert "What is 6*7?" in client.send("hello", "What did I ask first?").text
        # AReaL's gateway WebSocket (`up` gives its servers --ws-port), same session.
        with ws_connect(f"ws://{edge}/ws") as ws:
            params = {"message": "What is 2*3?", "sessionKey": "hello"}
            ws.send(json.dumps({"type": "req", "id": "1", "method": "agent", "params": params}))
            answers = [json.loads(ws.recv(timeout=60))]
            while answers[-1]["payload"].get("status") in (None, "accepted"):
                answers.append(json.loads(ws.recv(timeout=60)))
        assert answers[-1]["payload"]["status"] == "complete"
        assert "6" in answers[-1]["payload"]["summary"]

        assert {p.name for p in run_dir.glob("*.log")} >= {
            "router.log",
            "server-1.log",
            "server-2.log",
            "worker-1.log",
            "envoy.log",
        }
        assert processes_mentioning(str(run_dir))

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 5
        assert processes_mentioning(str(run_dir)) == []
        host, port = edge.rsplit(":", 1)
        with socket.socket() as s:
            assert s.connect_ex((host, int(port))) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_busy_port_fails_cleanly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run_dir = tmp_path / "run"
        proc = _up(run_dir, "--port", str(port))
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"port {port}" in err
    assert len(err.strip().splitlines()) == 1
    assert processes_mentioning(str(run_dir)) == []


def test_missing_agent_fails_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _up(run_dir, "--port", "0", "--agent", "no_such_module:Agent")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "no_such_module" in err
    assert len(err.strip().splitlines()) == 1
    assert processes_mentioning(str(run_dir)) == []


def test_two_servers_on_one_sqlite_file_are_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    store = f"sqlite:{tmp_path / 'one.db'}"
    proc = _up(run_dir, "--port", "0", "--servers", "2", "--store", store)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "a SQLite store serves one server" in err
    assert len(err.strip().splitlines()) == 1
    assert processes_mentioning(str(run_dir)) == []


def test_config_file_and_flags(tmp_path: Path) -> None:
    from turnmesh.cli._up_config import load

    path = tmp_path / "turnmesh.toml"
    path.write_text('[up]\nagent = "echo"\nservers = 3\nport = 9000\n')
    config = load(path, {"port": 9100, "workers": None})
    assert (config.agent, config.servers, config.port, config.workers) == ("echo", 3, 9100, 1)


def _seconds(timestamp: str) -> float:
    parsed = Timestamp()
    parsed.FromJsonString(timestamp)
    return parsed.ToNanoseconds() / 1e9


def test_up_gives_its_servers_the_settings_of_its_flags_and_file(tmp_path: Path) -> None:
    """--session-ttl reaches the server (a session's expiry says so), over the
    file's; a key only in the file reaches it too."""
    config = tmp_path / "turnmesh.toml"
    config.write_text("[up]\nsession_ttl = 60\nmax_sessions = 1\n")
    run_dir = tmp_path / "run"
    with (
        UpProcess(run_dir, "--port", "0", "--config", str(config), "--session-ttl", "4321") as up,
        httpx.Client(base_url=f"http://{up.edge()}", timeout=30) as rest,
    ):
        created = rest.post("/v1/sessions", json={})
        assert created.status_code == 200, created.text
        session = created.json()["session"]
        ttl = _seconds(session["expireTime"]) - _seconds(session["lastActivity"])
        assert ttl == pytest.approx(4321, abs=0.01)
        refused = rest.post("/v1/sessions", json={})
        assert refused.status_code == 429, refused.text
        assert "maximum of 1 sessions" in refused.json()["detail"]


def _read_banner(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("Ctrl-C stops the mesh."):
            break
    threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True).start()
    return "".join(lines)


def test_restart_never_stops_the_mesh_when_a_component_dies(tmp_path: Path) -> None:
    """Today's behaviour, on request: one dead child stops everything."""
    run_dir = tmp_path / "run"
    proc = _up(run_dir, "--port", "0", "--restart", "never")
    try:
        _read_banner(proc)
        os.kill(_status_pids(run_dir)["worker-1"], signal.SIGKILL)
        assert proc.wait(timeout=30) == 1
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "worker-1 exited unexpectedly (killed by SIGKILL); stopping the mesh" in err
        assert "worker-1.log" in err
        assert "restart 1" not in err
        assert processes_mentioning(str(run_dir)) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_bad_host_fails_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _up(run_dir, "--host", "not-an-address", "--port", "0")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "invalid Envoy config" in err
    assert not run_dir.exists()  # refused before anything started
    assert "turnmesh up:" in err
    assert processes_mentioning(str(run_dir)) == []


def test_up_with_https_tls_and_tracing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the SDK's batch delay (5 s)
    ca = TestCA(tmp_path / "ca")
    member, edge_cert = ca.issue("member"), ca.issue("edge")
    collector = Collector().start()
    run_dir = tmp_path / "run"
    proc = _up(
        run_dir,
        "--port",
        "0",
        "--otlp-endpoint",
        collector.endpoint,
        *member.flags(),
        "--edge-tls-cert",
        str(edge_cert.cert_file),
        "--edge-tls-key",
        str(edge_cert.key_file),
    )
    try:
        banner = _read_banner(proc)
        match = re.search(r"REST/SSE and gRPC\s+https://(\S+)", banner)
        assert match, banner
        assert "-plaintext" not in banner
        trust = ssl.create_default_context(cafile=ca.ca_file)
        with httpx.Client(base_url=f"https://{match.group(1)}", verify=trust, timeout=30) as rest:
            sid = rest.post("/v1/sessions", json={}).json()["session"]["sessionId"]
            turn = rest.post(f"/v1/sessions/{sid}/turns", json={"message": "What is 6*7?"})
            assert turn.status_code == 200
            assert "42" in turn.text
        # Inside, the router speaks only mutual TLS.
        router_log = (run_dir / "router.log").read_text()
        router = re.search(r"router serving on (\S+)", router_log)
        assert router, router_log
        with (
            grpc.insecure_channel(router.group(1)) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # Every component and Envoy got the collector's address.
        expected = {"turnmesh-edge", "turnmesh-server", "turnmesh-worker", "turnmesh-router"}
        wait_for(
            lambda: {s.service for s in collector.spans()} >= expected,
            timeout=30,
            what="spans from every component",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        collector.stop()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_up_with_an_agent_file(tmp_path: Path) -> None:
    agent_file = tmp_path / "helper.yaml"
    agent_file.write_text("name: helper\nkind: echo\n")
    run_dir = tmp_path / "run"
    proc = _up(run_dir, "--port", "0", "--agent", str(agent_file))
    try:
        banner = _read_banner(proc)
        assert "agent 'helper'" in banner or str(agent_file) in banner
        match = re.search(r"REST/SSE and gRPC\s+http://(\S+)", banner)
        assert match, banner
        with Client(match.group(1)) as client:
            session = client.create_session()
            assert session.agent_name == "helper"
            assert "hello" in client.send(session.session_id, "hello").text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_bad_agent_file_stops_up_before_it_starts(tmp_path: Path) -> None:
    agent_file = tmp_path / "bad.yaml"
    agent_file.write_text("name: helper\nkind: openai\n")
    run_dir = tmp_path / "run"
    proc = _up(run_dir, "--port", "0", "--agent", str(agent_file))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "needs `model`" in err and str(agent_file) in err
    assert not run_dir.exists()


def test_a_reused_run_dir_starts_a_fresh_mesh(tmp_path: Path) -> None:
    """Ready files and Envoy's address from the last run are never trusted."""
    run_dir = tmp_path / "run"
    for attempt in range(2):
        proc = _up(run_dir, "--port", "0")
        try:
            banner = _read_banner(proc)
            match = re.search(r"REST/SSE and gRPC\s+http://(\S+)", banner)
            assert match, (attempt, banner)
            with httpx.Client(base_url=f"http://{match.group(1)}", timeout=30) as rest:
                assert rest.get("/ready").status_code == 200
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def _turn(rest: httpx.Client, session_id: str, message: str) -> str:
    """One turn through the edge; its answer's text (the turn must finish)."""
    with rest.stream(
        "POST", f"/v1/sessions/{session_id}/turns", json={"message": message}
    ) as response:
        assert response.status_code == 200, response.read()
        events = [
            json.loads(line[len("data: ") :])
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    return "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


MESH_KEY = "up-test-mesh-key-0123456789abcdef"


def _registered(router: str) -> dict[str, int]:
    """How many members of each role the router lists (it needs the mesh key)."""
    try:
        with grpc.insecure_channel(router) as channel:
            listed = RouterServiceStub(channel).ListMembers(
                rpb.ListMembersRequest(), timeout=10, metadata=((MESH_KEY_METADATA, MESH_KEY),)
            )
    except grpc.RpcError:
        return {}
    roles = [
        rpb.MemberRole.Name(m.role).removeprefix("MEMBER_ROLE_").lower() for m in listed.members
    ]
    return {role: roles.count(role) for role in set(roles)}


def test_up_restarts_a_killed_worker_and_server_on_their_addresses(tmp_path: Path) -> None:
    """SIGKILL a worker and a server: `up` says so, restarts each on its own
    port, and with Redis every session comes back whole, on any server. Then
    the router and Envoy."""
    redis = RedisServer(tmp_path)
    run_dir = tmp_path / "run"
    up = UpProcess(run_dir, "--port", "0", "--servers", "2", "--workers", "2",
                   "--store", redis.url,
                   env={**clean_env(), "TURNMESH_MESH_KEY": MESH_KEY})  # fmt: skip
    try:
        edge = up.edge()
        sessions = [f"kept-{i}" for i in range(6)]
        with httpx.Client(base_url=f"http://{edge}", timeout=60) as rest:
            for sid in sessions:
                assert rest.post("/v1/sessions", json={"sessionId": sid}).status_code == 200
                assert "42" in _turn(rest, sid, "What is 6*7?")
        before = up.status()
        mark = up.mark()
        for name in ("worker-1", "server-1"):
            os.kill(before[name]["pid"], signal.SIGKILL)
        for name in ("worker-1", "server-1"):
            up.wait_line(
                rf"{name} exited \(killed by SIGKILL\); restart 1 in 0\.5 s "
                rf"\(log: {re.escape(str(run_dir / name))}\.log\)",
                after=mark,
            )
            up.wait_line(
                rf"{name} is back on {re.escape(before[name]['address'])} \(pid \d+, restart 1\)",
                after=mark,
            )
        after = up.status()
        for name in ("worker-1", "server-1"):
            assert after[name]["pid"] != before[name]["pid"]
            assert after[name]["address"] == before[name]["address"]
            assert (after[name]["state"], after[name]["restarts"]) == ("running", 1)
            assert after[name]["last_exit"] == "killed by SIGKILL"
        for name in ("router", "worker-2", "server-2", "envoy"):
            assert after[name]["pid"] == before[name]["pid"]
            assert after[name]["restarts"] == 0

        shown = subprocess.run(
            [sys.executable, "-m", "turnmesh", "status", "--run-dir", str(run_dir)],
            capture_output=True, text=True, timeout=60, check=False, env=clean_env(),
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert ": running" in shown.stdout.splitlines()[0]
        (row,) = [line for line in shown.stdout.splitlines() if line.startswith("server-1 ")]
        assert row.split()[:4] == ["server-1", str(after["server-1"]["pid"]), "running", "1"]
        assert "killed by SIGKILL" in row and before["server-1"]["address"] in row

        # Every conversation goes on through the edge with its whole history,
        # and the restarted server itself serves each one from Redis.
        with httpx.Client(base_url=f"http://{edge}", timeout=60) as rest:
            for sid in sessions:
                assert "What is 6*7?" in _turn(rest, sid, "What did I ask first?")
        with Client(after["server-1"]["address"]) as direct:
            for sid in sessions:
                asked = [m.content for m in direct.history(sid) if m.role == "user"]
                assert asked == ["What is 6*7?", "What did I ask first?"]

        # The router and Envoy come back the same way, and the mesh serves on.
        mark = up.mark()
        for name in ("router", "envoy"):
            os.kill(after[name]["pid"], signal.SIGKILL)
        for name in ("router", "envoy"):
            up.wait_line(rf"{name} is back on {re.escape(after[name]['address'])} ", after=mark)
        # A new router knows no one until the members register again (each
        # within a heartbeat); until then turns are UNAVAILABLE, retryable.
        wait_for(lambda: _registered(after["router"]["address"]) == {"server": 2, "worker": 2},
                 timeout=120, what="every member registered with the new router")  # fmt: skip
        with httpx.Client(base_url=f"http://{edge}", timeout=60) as rest:
            for sid in sessions:
                assert "What is 6*7?" in _turn(rest, sid, "And what did I ask first?")
        assert up.proc.poll() is None
        up.proc.send_signal(signal.SIGTERM)
        assert up.wait_exit() == 0
        assert processes_mentioning(str(run_dir)) == []
    finally:
        up.close()
        redis.stop()


def test_a_spent_restart_budget_stops_the_mesh_and_says_why(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with UpProcess(run_dir, "--port", "0", "--restart-budget", "1") as up:
        up.banner()
        os.kill(up.status()["worker-1"]["pid"], signal.SIGKILL)
        up.wait_line(r"worker-1 is back on \S+ \(pid \d+, restart 1\)")
        os.kill(up.status()["worker-1"]["pid"], signal.SIGKILL)
        assert up.wait_exit() == 1
        log = run_dir / "worker-1.log"
        last = up.text().strip().splitlines()[-1]
        assert last == (
            "turnmesh up: worker-1 exited (killed by SIGKILL) after 1 restart(s), and its "
            f"budget is 1 within 300 s; stopping the mesh (log: {log})"
        )
        assert processes_mentioning(str(run_dir)) == []
        # The log holds both lives of the worker: a restart appends.
        assert log.read_text().count("serving agent 'demo'") == 2
        final = json.loads((run_dir / "status.json").read_text())
        assert final["state"] == "stopped"
