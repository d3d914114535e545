"""The README's examples run, as written, against a real mesh."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import SharedMesh
from tests.integration.test_grpcurl import _objects

ROOT = Path(__file__).resolve().parents[2]
README_ADDRESS = "127.0.0.1:8080"


def _block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- example: {marker} .*?-->\s*```\w+\n(.*?)```", text, re.S)
    assert match, f"README example {marker!r} not found"
    return match.group(1)


def test_readme_curl_quickstart(shared_mesh: SharedMesh) -> None:
    outputs = []
    for line in _block("curl").strip().splitlines():
        args = shlex.split(line.replace(README_ADDRESS, shared_mesh.edge))
        assert args[0] == "curl"
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert json.loads(outputs[0])["session"]["sessionId"] == "quickstart"

    def events(output: str) -> list[dict[str, object]]:
        frames = [f for f in output.split("\n\n") if f.strip()]
        assert all(f.startswith("data: ") for f in frames), output
        return [json.loads(f[len("data: ") :]) for f in frames]

    def text(output: str) -> str:
        return "".join(str(e.get("delta", "")) for e in events(output))

    assert events(outputs[1])[-1]["type"] == "RUN_FINISHED"
    assert "84" in text(outputs[1])
    assert "What is 12*(3+4)?" in text(outputs[2])
    assert len(json.loads(outputs[3])["messages"]) == 6
    problem = json.loads(outputs[4])
    assert problem["status"] == 400
    assert problem["violations"] == [{"field": "message", "description": "must not be blank"}]


def test_readme_files_example(shared_mesh: SharedMesh) -> None:
    outputs = []
    for line in _block("files").strip().splitlines():
        args = shlex.split(line.replace(README_ADDRESS, shared_mesh.edge))
        assert args[0] == "curl"
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    frames = [json.loads(f[len("data: ") :]) for f in outputs[1].split("\n\n") if f.strip()]
    assert frames[-1]["type"] == "RUN_FINISHED"
    assert "4-18-27" in "".join(str(e.get("delta", "")) for e in frames)
    assert any(e.get("name") == "file_read" for e in frames)


def test_readme_grpcurl_conversation(shared_mesh: SharedMesh) -> None:
    address = shared_mesh.edge
    outputs = []
    for line in _block("grpcurl").strip().splitlines():
        args = shlex.split(line.replace(README_ADDRESS, address))
        assert args[0] == ".venv/bin/grpcurl"
        args[0] = str(Path(sys.executable).parent / "grpcurl")
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)

    def text(output: str) -> str:
        return "".join(str(e.get("delta", "")) for e in _objects(output))

    assert "84" in text(outputs[1])
    assert "What is 12*(3+4)?" in text(outputs[2])
    history = json.loads(outputs[3])
    assert [m["role"] for m in history["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]


def test_readme_a2a_grpcurl(shared_mesh: SharedMesh) -> None:
    outputs = []
    # The README's ids are fixed: a fresh context each run.
    context = f"a2a-thread-{uuid.uuid4()}"
    for line in _block("a2a-grpcurl").strip().splitlines():
        args = shlex.split(line.replace(README_ADDRESS, shared_mesh.edge))
        assert args[0] == ".venv/bin/grpcurl"
        args[0] = str(Path(sys.executable).parent / "grpcurl")
        args = [a.replace("a2a-thread", context) for a in args]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    task = json.loads(outputs[0])["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "42" in task["artifacts"][0]["parts"][0]["text"]
    streamed: list[Any] = _objects(outputs[1])
    assert streamed[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    text = "".join(
        p["text"]
        for e in streamed
        if "artifactUpdate" in e
        for p in e["artifactUpdate"]["artifact"]["parts"]
    )
    assert "What is 6*7?" in text


def test_readme_a2a_curl(shared_mesh: SharedMesh) -> None:
    context = f"a2a-curl-{uuid.uuid4()}"
    outputs = []
    for line in _block("a2a-curl").strip().splitlines():
        args = shlex.split(line.replace(README_ADDRESS, shared_mesh.edge))
        assert args[0] == "curl"
        args = [a.replace("a2a-curl", context) for a in args]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    card = json.loads(outputs[0])
    assert card["name"] == "demo"
    assert {i["protocolBinding"] for i in card["supportedInterfaces"]} == {
        "HTTP+JSON",
        "JSONRPC",
        "GRPC",
    }
    task = json.loads(outputs[1])["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "42" in task["artifacts"][0]["parts"][0]["text"]
    frames = [json.loads(f[len("data: ") :]) for f in outputs[2].split("\n\n") if f.strip()]
    assert frames[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    text = "".join(
        p["text"]
        for f in frames
        if "artifactUpdate" in f
        for p in f["artifactUpdate"]["artifact"]["parts"]
    )
    assert "What is 6*7?" in text


def test_readme_a2a_jsonrpc(shared_mesh: SharedMesh) -> None:
    context = f"a2a-rpc-{uuid.uuid4()}"
    outputs = []
    for line in _block("a2a-jsonrpc").strip().splitlines():
        args = shlex.split(line.replace(README_ADDRESS, shared_mesh.edge))
        assert args[0] == "curl"
        args = [a.replace("a2a-rpc", context) for a in args]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    sent = json.loads(outputs[0])
    assert sent["id"] == 1
    assert "42" in sent["result"]["task"]["artifacts"][0]["parts"][0]["text"]
    frames = [json.loads(f[len("data: ") :]) for f in outputs[1].split("\n\n") if f.strip()]
    assert {f["id"] for f in frames} == {2}
    assert frames[-1]["result"]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    text = "".join(
        p["text"]
        for f in frames
        if "artifactUpdate" in f["result"]
        for p in f["result"]["artifactUpdate"]["artifact"]["parts"]
    )
    assert "What is 6*7?" in text
    assert json.loads(outputs[2])["error"]["code"] == -32001


def test_readme_a2a_python(shared_mesh: SharedMesh) -> None:
    code = _block("a2a-python").replace(README_ADDRESS, shared_mesh.edge)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout


def test_readme_python_client(shared_mesh: SharedMesh) -> None:
    code = _block("python").replace(README_ADDRESS, shared_mesh.edge)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "12*(3+4) = 84."
    assert "What is 12*(3+4)?" in lines[1]
    assert lines[2:][0].startswith("user What is 12*(3+4)?")
    assert lines[-1].startswith("assistant ")


def test_readme_openai_example(shared_mesh: SharedMesh) -> None:
    code = _block("openai").replace(README_ADDRESS, shared_mesh.edge)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "6*7 = 42."


def test_readme_agui_example(shared_mesh: SharedMesh) -> None:
    import shutil

    code = _block("agui").replace(README_ADDRESS, shared_mesh.edge)
    client_dir = ROOT / "clients" / "agui"
    script = client_dir / ".readme-example.mjs"  # beside node_modules, so imports resolve
    script.write_text(code)
    try:
        node = shutil.which("node")
        assert node
        result = subprocess.run(
            [node, script.name],
            cwd=client_dir,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        script.unlink()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "6*7 = 42."


def test_readme_simple_chat_example(shared_mesh: SharedMesh) -> None:
    (line,) = _block("chat").strip().splitlines()
    args = shlex.split(line.replace(README_ADDRESS, shared_mesh.edge))
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["content"] == "6*7 = 42."
    assert answer["tool_calls"][0]["name"] == "calculator"


def test_readme_pauses_example(shared_mesh: SharedMesh) -> None:
    script = _block("pauses").replace(README_ADDRESS, shared_mesh.edge)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert '"pendingToolCallIds":["call_' in out
    assert '"reason":"tool_approval"' in out
    frames = [
        json.loads(line[len("data: ") :]) for line in out.splitlines() if line.startswith("data: ")
    ]
    said = "".join(str(frame.get("delta", "")) for frame in frames)
    assert 'Your get_weather returned: "sunny, 21 C".' in said
    assert "Approved: calculator returned 42." in said


def test_readme_python_pauses_example(shared_mesh: SharedMesh) -> None:
    code = _block("python-pauses").replace(README_ADDRESS, shared_mesh.edge)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        'Your get_weather returned: "snow".',
        "Approved: calculator returned 42.",
    ]


def test_readme_openai_pauses_example(shared_mesh: SharedMesh) -> None:
    code = _block("openai-pauses").replace(README_ADDRESS, shared_mesh.edge)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    tool_loop, approval = result.stdout.splitlines()
    assert tool_loop == 'Your get_weather returned: "warm".'
    assert approval.startswith("Approved: calculator returned 42.")
