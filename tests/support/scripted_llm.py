"""A scripted OpenAI-compatible chat-completions server on loopback, for the
tool-loop paths a real model cannot be made to produce here (tool calls on
cue, a 429 then success, a stream that never ends). It speaks the real wire
format (SSE chunks) to the real ``openai`` SDK and records every request.

The script is chosen by a tag in the last user message, e.g. ``[two-tools]``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
    payload = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        payload = {**payload, "choices": [], "usage": usage}
    return f"data: {json.dumps(payload)}\n\n".encode()


def _tool_call(index: int, call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool_calls": [
            {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
    }


TOOL_SCRIPTS = ("raising-tool", "slow-tool", "missing-tool", "bad-args")


class ScriptedLLM:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.disconnected = threading.Event()
        self._rate_limited: set[str] = set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length))
                owner.requests.append({"body": body, "auth": self.headers.get("authorization")})
                owner._answer(self, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- scripts ---------------------------------------------------------------

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        messages = body["messages"]
        users = [m for m in messages if m["role"] == "user"]
        tag = re.search(r"\[([a-z-]+)\]", str(users[-1]["content"]) if users else "")
        script = tag[1] if tag else "plain"
        # Tool results since the last user message: where the loop is.
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        results = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
        if handler.headers.get("authorization") == "Bearer wrong-key":
            self._error(handler, 401, "invalid api key")
            return
        if script == "rate-limit" and users[-1]["content"] not in self._rate_limited:
            self._rate_limited.add(users[-1]["content"])
            self._error(handler, 429, "slow down", {"retry-after-ms": "20"})
            return
        if script == "server-error":
            self._error(handler, 500, "boom")
            return
        self._begin(handler)
        try:
            if script == "two-tools" and len(results) == 0:
                self._send(handler, _chunk({"role": "assistant", "content": "Let me check. "}))
                self._send(
                    handler, _chunk(_tool_call(0, "call_1", "calculator", {"expression": "6*7"}))
                )
                self._send(handler, _chunk({}, "tool_calls"))
            elif script == "two-tools" and len(results) == 1:
                self._send(
                    handler, _chunk(_tool_call(0, "call_2", "current_time", {"timezone": "UTC"}))
                )
                self._send(handler, _chunk({}, "tool_calls"))
            elif (
                script in ("raising-tool", "slow-tool", "missing-tool", "bad-args") and not results
            ):
                tools: dict[str, tuple[str, dict[str, Any]]] = {
                    "raising-tool": ("broken", {"text": "x"}),
                    "slow-tool": ("slow", {"seconds": 30}),
                    "missing-tool": ("no_such_tool", {}),
                    "bad-args": ("calculator", {"wrong": 1}),
                }
                name, args = tools[script]
                self._send(handler, _chunk(_tool_call(0, "call_x", name, args)))
                self._send(handler, _chunk({}, "tool_calls"))
            elif script in ("client-tool", "approve", "mixed") and not results:
                # The caller's tool is offered beside the agent's: call it by name.
                offered = {t["function"]["name"] for t in body.get("tools", ())}
                scripts: dict[str, list[tuple[str, dict[str, Any]]]] = {
                    "client-tool": [("get_weather", {"city": "Oslo"})],
                    "approve": [("transfer", {"amount": 5})],
                    "mixed": [("calculator", {"expression": "6*7"}), ("get_weather", {})],
                }
                for index, (name, args) in enumerate(scripts[script]):
                    if name in offered:
                        self._send(handler, _chunk(_tool_call(index, f"call_{name}", name, args)))
                self._send(handler, _chunk({}, "tool_calls"))
            elif script == "forever":
                for n in range(600):
                    self._send(handler, _chunk({"content": f"tok{n} "}))
                    time.sleep(0.1)
            else:
                # The answer: the tool results so far, or an echo, word by word.
                text = " | ".join(results) if results else f"echo: {users[-1]['content']}"
                for word in text.split(" "):
                    self._send(handler, _chunk({"content": word + " "}))
                self._send(handler, _chunk({}, "stop"))
            self._send(
                handler,
                _chunk({}, usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}),
            )
            self._send(handler, b"data: [DONE]\n\n")
            self._send(handler, b"")  # the chunked body's end
        except (BrokenPipeError, ConnectionResetError):
            self.disconnected.set()

    def _error(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        body = json.dumps({"error": {"message": message, "type": "error", "code": None}}).encode()
        handler.send_response(status)
        handler.close_connection = True  # no keep-alive: stop() really stops it
        handler.send_header("connection", "close")
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _begin(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.close_connection = True
        handler.send_header("connection", "close")
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()

    def _send(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        handler.wfile.flush()
