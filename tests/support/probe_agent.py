"""A test agent loaded by workers as ``probe_agent:ProbeAgent``.

It leaves marker files in $TURNMESH_PROBE_DIR so that tests can see, from
outside the worker process, that a turn started (and in which process) and
that a cancellation reached the agent as asyncio.CancelledError, and the
metadata it was given (``<turn>.metadata.json``).

Metadata: ``deltas`` (count), ``delay_ms`` (between deltas),
``stall_first_attempt`` (the first worker to run the turn stalls before
emitting anything: the test kills it there to see a transparent retry),
``fail_once`` (a name: the first turn carrying it fails with AgentError).
"narrated" writes text before, between and after two calls of its own
``lookup``; "narrated client" writes text, then calls the caller's first
tool (the turn waits for it). A message "gate:NAME" gates the turn as
``gate`` does (for clients that send no metadata, such as AG-UI's).

A message "mixed calls" makes one assistant message with a call of the
caller's first tool beside a call of the agent's own ``lookup``, run at once;
"mixed approval" gates a call of its own ``deploy`` with an approval beside
the ``lookup``. The turn that answers says what it got (after a first delta
and, with ``gate`` in its metadata, once the gate opens).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from turnmesh.agent import AgentError, AgentRequest, AgentResponse, EventEmitter, Interrupt


class ProbeAgent:
    name = "probe"

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        if request.tool_results or request.resume:
            return await _answered(request, emitter)
        if request.message in ("mixed calls", "mixed approval"):
            return await _mixed(request, emitter)
        if request.message in ("narrated", "narrated client"):
            return await _narrated(request, emitter)
        probe = Path(os.environ["TURNMESH_PROBE_DIR"])
        started = probe / f"{request.turn_id}.started"
        first_attempt = not started.exists()
        (probe / f"{request.turn_id}.{os.getpid()}.started").write_text(str(os.getpid()))
        started.write_text(str(os.getpid()))
        # Which session (its mesh-wide id) and principal the agent was given.
        (probe / f"{request.turn_id}.who").write_text(f"{request.principal} {request.session_id}")
        # The metadata the agent was given (A2A's data parts arrive in it).
        (probe / f"{request.turn_id}.metadata.json").write_text(json.dumps(request.metadata))
        deltas = int(request.metadata.get("deltas", 5))
        delay = float(request.metadata.get("delay_ms", 50)) / 1000
        parts: list[str] = []
        if fail_once := request.metadata.get("fail_once"):
            marker = probe / f"failed-once-{fail_once}"
            if not marker.exists():
                marker.write_text(request.turn_id)
                raise AgentError("Probe failure", "this turn fails once, on purpose")
        try:
            if request.metadata.get("stall_first_attempt") and first_attempt:
                await asyncio.sleep(3600)
            for i in range(deltas):
                part = f"part{i} "
                parts.append(part)
                await emitter.emit_delta(part)
                await asyncio.sleep(delay)
                if i == 0 and (gate := request.metadata.get("gate") or _gate_cue(request)):
                    # Running until the test opens the gate (creates the file,
                    # from another process: no Event can carry that).
                    while not (probe / f"gate-{gate}").exists():  # noqa: ASYNC110
                        await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            (probe / f"{request.turn_id}.cancelled").write_text(str(os.getpid()))
            raise
        return AgentResponse(text="".join(parts))


async def _narrated(request: AgentRequest, emitter: EventEmitter) -> AgentResponse:
    await emitter.emit_delta("calling tools. ")
    if request.message == "narrated client":
        await emitter.emit_tool_call(request.tools[0].name, {"q": 1})
        return AgentResponse()
    for text in ("between tools. ", "done."):
        lookup = await emitter.emit_tool_call("lookup", {"q": text})
        await emitter.emit_tool_result(lookup, "found")
        await emitter.emit_delta(text)
    return AgentResponse()


def _gate_cue(request: AgentRequest) -> str | None:
    cue, sep, name = request.message.partition("gate:")
    return name.strip() if sep and not cue else None


async def _mixed(request: AgentRequest, emitter: EventEmitter) -> AgentResponse:
    if request.message == "mixed calls":
        await emitter.emit_tool_call(request.tools[0].name, {"q": 1})
        interrupts = []
    else:
        gated = await emitter.emit_tool_call("deploy", {"env": "prod"})
        interrupts = [Interrupt(message="deploy?", tool_call_id=gated)]
    lookup = await emitter.emit_tool_call("lookup", {"q": 2})
    await emitter.emit_tool_result(lookup, "found")
    return AgentResponse(interrupts=interrupts)


async def _answered(request: AgentRequest, emitter: EventEmitter) -> AgentResponse:
    parts = [f"result {r.content or r.error}" for r in request.tool_results]
    for entry in request.resume:
        if entry.tool_call is not None:
            ran = "deployed" if entry.approved else "error: not approved"
            await emitter.emit_tool_result(entry.tool_call["id"], ran)
        parts.append(f"resume {entry.status}")
    text = "; ".join(parts)
    await emitter.emit_delta(text)
    if gate := request.metadata.get("gate"):
        probe = Path(os.environ["TURNMESH_PROBE_DIR"])
        while not (probe / f"gate-{gate}").exists():  # noqa: ASYNC110 -- another process opens it
            await asyncio.sleep(0.02)
    return AgentResponse(text=text)
