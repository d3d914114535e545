"""``openai``: a model-backed agent with a tool loop, for any OpenAI-compatible
chat-completions endpoint (vLLM, SGLang, llama.cpp's server, Ollama, hosted
APIs), through the official ``openai`` SDK.

Each turn sends the instructions, the session's history and the new message
(with the text of any attached files), streams the model's tokens out as
deltas, and runs the tools it calls (each with a time limit), sending their
results back until the model answers.

The caller's own tools (``AgentRequest.tools``) are offered to the model
beside the agent's; a call of one ends the turn waiting for the client, as
does a call of a tool named in ``approval`` (an interrupt asking to run it).
The turn that answers sends the client's results, or runs the approved calls
(a denied one gets "error: not approved"), and the loop goes on. Errors from the model become an
``AgentError`` with a useful title; the SDK retries what is safe to retry
(connection errors, 429 and 5xx before any token arrived) a bounded number of
times.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from turnmesh.agent._contract import (
    AgentError,
    AgentRequest,
    AgentResponse,
    ClientTool,
    EventEmitter,
    Interrupt,
    Resume,
    TokenUsage,
    ToolResult,
)
from turnmesh.agent._prompt import file_context
from turnmesh.agent.tools import Tool, load_tool

__all__ = ["ModelSettings", "OpenAIAgent"]


class ModelSettings(BaseModel):
    """Where the model is and how to call it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="the model id the endpoint serves")
    base_url: str | None = Field(
        default=None,
        description="the endpoint, e.g. http://127.0.0.1:8000/v1 (else OPENAI_BASE_URL)",
    )
    # The key: from this variable, or given here (`${VAR}` in a file keeps it out).
    api_key_env: str = Field(default="OPENAI_API_KEY", min_length=1)
    api_key: SecretStr | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, gt=0)
    timeout_seconds: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, usage: Any) -> None:
        if usage is not None:
            self.input_tokens += usage.prompt_tokens or 0
            self.output_tokens += usage.completion_tokens or 0


@dataclass
class _Step:
    text: str = ""
    calls: dict[int, _Call] = field(default_factory=dict)


# What an approval's answer may be: true/false, or {"approved": true/false}.
APPROVAL_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "boolean"},
        {
            "type": "object",
            "properties": {"approved": {"type": "boolean"}},
            "required": ["approved"],
        },
    ]
}


def _client_schema(tool: ClientTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "description": tool.description}
    function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _tool_message(result: ToolResult) -> dict[str, Any]:
    content = result.content if result.error is None else f"error: {result.error}"
    return {"role": "tool", "tool_call_id": result.tool_call_id, "content": content}


# (exception type, title, detail, code, HTTP status), first match wins.
_MODEL_ERRORS: tuple[tuple[type[openai.OpenAIError], str, str, str, int], ...] = (
    (openai.APITimeoutError, "Model timed out", "the model did not answer in time",
     "model_timeout", 504),
    (openai.APIConnectionError, "Model unreachable", "the model endpoint could not be reached",
     "model_unreachable", 502),
    (openai.AuthenticationError, "Model refused the API key",
     "the model endpoint rejected the agent's credentials", "model_auth", 502),
    (openai.PermissionDeniedError, "Model refused the API key",
     "the model endpoint rejected the agent's credentials", "model_auth", 502),
    (openai.RateLimitError, "Model rate limited",
     "the model endpoint is rate limiting; try again later", "model_rate_limited", 503),
    (openai.NotFoundError, "Model not found",
     "the model endpoint does not serve the configured model", "model_not_found", 502),
)  # fmt: skip


def _model_error(exc: openai.OpenAIError) -> AgentError:
    """What the caller is told; the SDK's own message stays in the log."""
    for kind, title, detail, code, status in _MODEL_ERRORS:
        if isinstance(exc, kind):
            return AgentError(title, detail, code=code, status=status)
    if isinstance(exc, openai.APIStatusError):
        detail = f"the model endpoint answered {exc.status_code}"
        return AgentError("Model error", detail, code="model_error", status=502)
    return AgentError("Model error", "the model call failed", code="model_error", status=502)


class OpenAIAgent:
    """A chat model with tools. ``tools`` are import paths or ``Tool``s."""

    def __init__(
        self,
        model: ModelSettings | None = None,
        *,
        name: str = "openai",
        instructions: str = "",
        tools: Sequence[str | Tool] = (),
        tool_timeout_seconds: float = 30.0,
        max_tool_rounds: int = 8,
        approval: Sequence[str] = (),
    ) -> None:
        if model is None:
            # `--agent openai` with no file: the model comes from the environment.
            model_name = os.environ.get("OPENAI_MODEL", "")
            if not model_name:
                raise ValueError("set OPENAI_MODEL, or describe the agent in a YAML file")
            model = ModelSettings(name=model_name)
        self.name = name
        self.settings = model
        self.instructions = instructions
        self.tools = {t.name: t for t in (load_tool(s) if isinstance(s, str) else s for s in tools)}
        unknown = sorted(set(approval) - set(self.tools))
        if unknown:
            raise ValueError(f"approval names tools the agent does not have: {', '.join(unknown)}")
        # The agent's tools whose calls wait for the client's approval.
        self.approval = frozenset(approval)
        self.tool_timeout_seconds = tool_timeout_seconds
        self.max_tool_rounds = max_tool_rounds
        self._client = openai.AsyncOpenAI(
            base_url=model.base_url or os.environ.get("OPENAI_BASE_URL") or None,
            # Local servers take any key; the SDK insists on one.
            api_key=(model.api_key.get_secret_value() if model.api_key else None)
            or os.environ.get(model.api_key_env)
            or "not-needed",
            timeout=model.timeout_seconds,
            max_retries=model.max_retries,
        )

    async def close(self) -> None:
        await self._client.close()

    def _messages(self, request: AgentRequest) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        for m in request.history:
            entry: dict[str, Any] = {
                k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in m
            }
            if m.get("error"):
                entry["content"] = f"error: {m['error']}"
            messages.append(entry)
        return messages

    def _user_message(self, request: AgentRequest) -> dict[str, Any]:
        content = request.message
        if request.files:
            content = f"{content}\n\n{file_context(request.files)}"
        return {"role": "user", "content": content}

    async def _answers(self, request: AgentRequest, emitter: EventEmitter) -> list[dict[str, Any]]:
        """The tool messages that answer the turn before's pause: the client's
        results, and the approved calls run now (a denied one is an error)."""
        messages = [_tool_message(result) for result in request.tool_results]
        for entry in request.resume:
            if entry.tool_call is not None:
                result = await self._approved(entry, emitter)
                messages.append(
                    {"role": "tool", "tool_call_id": entry.tool_call["id"], "content": result}
                )
        return messages

    async def _approved(self, entry: Resume, emitter: EventEmitter) -> str:
        assert entry.tool_call is not None
        call_id = entry.tool_call["id"]
        function = entry.tool_call["function"]
        tool = self.tools.get(function["name"])
        if not entry.approved:
            result = "error: not approved"
        elif tool is None:  # the agent changed while the session waited
            result = f"error: there is no tool named {function['name']!r}"
        else:
            result = await tool.invoke(function["arguments"], self.tool_timeout_seconds)
        await emitter.emit_tool_result(call_id, result)
        return result

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        messages = self._messages(request)
        messages.extend(await self._answers(request, emitter))
        if request.messages:
            messages.append(self._user_message(request))
        # The caller's tools, unless the agent has one of the same name (its own wins).
        client_tools = {t.name: t for t in request.tools if t.name not in self.tools}
        usage = _Usage()
        for _ in range(self.max_tool_rounds + 1):
            step = await self._step(messages, emitter, usage, client_tools)
            if not step.calls:
                return self._response(step.text, usage)
            calls = [step.calls[i] for i in sorted(step.calls)]
            messages.append(
                {
                    "role": "assistant",
                    "content": step.text or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in calls
                    ],
                }
            )
            interrupts = []
            waits = False
            for call in calls:
                if call.name in client_tools:  # the client runs it: no result here
                    await emitter.emit_tool_call(call.name, call.arguments, call_id=call.id or None)
                    waits = True
                elif call.name in self.approval:
                    interrupts.append(await self._ask_approval(call, emitter))
                else:
                    result = await self._run_tool(call, emitter)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if waits or interrupts:
                # The turn ends waiting for the client; the next one goes on.
                return self._response(step.text, usage, interrupts)
        raise AgentError(
            "Too many tool calls",
            f"the model kept calling tools after {self.max_tool_rounds} rounds",
            code="tool_loop",
        )

    def _response(
        self, text: str, usage: _Usage, interrupts: list[Interrupt] | None = None
    ) -> AgentResponse:
        return AgentResponse(
            text=text,
            metadata={"model": self.settings.name},
            usage=TokenUsage(usage.input_tokens, usage.output_tokens),
            interrupts=interrupts or [],
        )

    async def _ask_approval(self, call: _Call, emitter: EventEmitter) -> Interrupt:
        call.id = await emitter.emit_tool_call(call.name, call.arguments, call_id=call.id or None)
        return Interrupt(
            reason="tool_approval",
            message=f"May I run {call.name} with {call.arguments or '{}'}?",
            tool_call_id=call.id,
            response_schema=APPROVAL_SCHEMA,
        )

    async def _run_tool(self, call: _Call, emitter: EventEmitter) -> str:
        call.id = await emitter.emit_tool_call(call.name, call.arguments, call_id=call.id or None)
        tool = self.tools.get(call.name)
        if tool is None:
            result = f"error: there is no tool named {call.name!r}"
        else:
            result = await tool.invoke(call.arguments, self.tool_timeout_seconds)
        await emitter.emit_tool_result(call.id, result)
        return result

    async def _step(
        self,
        messages: list[dict[str, Any]],
        emitter: EventEmitter,
        usage: _Usage,
        client_tools: dict[str, ClientTool],
    ) -> _Step:
        """One model call, streamed: text out as deltas, tool calls collected."""
        options: dict[str, Any] = {}
        tools = [t.schema() for t in self.tools.values()]
        tools += [_client_schema(t) for t in client_tools.values()]
        if tools:
            options["tools"] = tools
        if self.settings.temperature is not None:
            options["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            options["max_tokens"] = self.settings.max_tokens
        step = _Step()
        try:
            # Plain dicts in OpenAI's JSON shape, for any compatible endpoint
            # (the SDK's TypedDicts would refuse nothing a server accepts).
            stream = await self._client.chat.completions.create(  # type: ignore[call-overload]
                model=self.settings.name,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                **options,
            )
        except openai.OpenAIError as exc:
            raise _model_error(exc) from exc
        try:
            async for chunk in stream:
                usage.add(chunk.usage)
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                if delta.content:
                    step.text += delta.content
                    await emitter.emit_delta(delta.content)
                for piece in delta.tool_calls or ():
                    call = step.calls.setdefault(piece.index, _Call())
                    call.id = piece.id or call.id
                    if piece.function is not None:
                        call.name += piece.function.name or ""
                        call.arguments += piece.function.arguments or ""
        except openai.OpenAIError as exc:
            raise _model_error(exc) from exc
        finally:
            # Also on cancellation: the model stops generating for us.
            with contextlib.suppress(Exception):
                await stream.close()
        return step
