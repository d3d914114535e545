"""Write docs/api.md from the descriptor set in gen/ (comments included).

Usage: python scripts/gen_api_docs.py [OUT]   (default: docs/api.md)
"""

from __future__ import annotations

import sys
from pathlib import Path

from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor_pb2

from turnmesh.envoy import edge_rows
from turnmesh.runtime import errors, turn_errors

ROOT = Path(__file__).resolve().parent.parent
# Paths into FileDescriptorProto for comments (descriptor.proto field numbers).
MESSAGE, ENUM, SERVICE, FIELD, VALUE, METHOD = 4, 5, 6, 2, 2, 2


def _comments(fd: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    return {
        tuple(loc.path): loc.leading_comments.strip()
        for loc in fd.source_code_info.location
        if loc.leading_comments.strip()
    }


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _a2a_service(fd: descriptor_pb2.FileDescriptorProto) -> list[str]:
    out = [f"## `{fd.name}` (`{fd.package}`, from the pinned a2a-sdk)", ""]
    for service in fd.service:
        out += [f"### service `{fd.package}.{service.name}`", ""]
        out += ["| RPC | request → response | HTTP |", "|---|---|---|"]
        for m in service.method:
            stream = "stream " if m.server_streaming else ""
            sig = f"`{m.input_type.split('.')[-1]}` → {stream}`{m.output_type.split('.')[-1]}`"
            rule: http_pb2.HttpRule = m.options.Extensions[annotations_pb2.http]
            bindings = " ".join(_http_rule(r) for r in (rule, *rule.additional_bindings))
            out.append(f"| `{m.name}` | {sig} | {bindings} |")
        out.append("")
    return out


def _http_rule(rule: http_pb2.HttpRule) -> str:
    kind = rule.WhichOneof("pattern")
    return f"`{kind.upper()} {getattr(rule, kind)}`" if kind else ""


def _http(method: descriptor_pb2.MethodDescriptorProto) -> str:
    """The method's HTTP bindings, its additional ones too."""
    rule: http_pb2.HttpRule = method.options.Extensions[annotations_pb2.http]
    return " ".join(filter(None, (_http_rule(r) for r in (rule, *rule.additional_bindings))))


PROTO_MODULE = [
    "## Using and changing the protos",
    "",
    "`proto/` is a Buf module (`buf.yaml`); the googleapis files it imports "
    "(`google/api/annotations.proto`, `http.proto`, `httpbody.proto`, and `google/rpc` "
    "for error details) are vendored under `third_party/`, the same files "
    "googleapis-common-protos ships. So a checkout needs no network: `buf build`, "
    "`protoc -Iproto -Ithird_party`, and `@grpc/proto-loader` with "
    '`includeDirs: ["proto", "third_party"]` (see `clients/grpc-js/turn.mjs`, which the '
    "tests run against a live mesh) all work as they are.",
    "",
    "`make lint` runs `buf lint` (Buf's STANDARD rules; the exceptions are declared in "
    "`buf.yaml`: AG-UI's unprefixed `EventType` names, and the raw-body and event-stream "
    "RPCs) and `buf breaking` on the public protos (session, event, message, compat) "
    "against `buf.baseline.binpb`, the public protos as last released. The worker and "
    "router protos are internal and free to change. A deliberate break of a public "
    "contract is allowed only by adding its rule and file to `breaking.ignore_only` in "
    "`buf.yaml`, with a comment naming the issue that needs it, and a line in this "
    "reference; `make proto-baseline` then makes the released protos the new baseline.",
    "",
]


# How-to sections, kept as Markdown beside this script (in this order).
PROSE = ["pauses.md", "a2a.md", "areal_ws.md"]
# A2A's contract, from the pinned a2a-sdk: its RPCs are listed (its own docs
# describe its messages).
A2A_PACKAGE = "lf.a2a.v1"


def render(fds: descriptor_pb2.FileDescriptorSet) -> str:
    out = [
        "# turnmesh API reference",
        "",
        "Generated from `proto/turnmesh/v1` and `scripts/api_prose/` by "
        "`scripts/gen_api_docs.py` (`make gen`). Do not edit.",
        "",
        *PROTO_MODULE,
    ]
    for name in PROSE:
        out += [(ROOT / "scripts" / "api_prose" / name).read_text().rstrip(), ""]
    for fd in sorted(fds.file, key=lambda f: f.name):
        if fd.package == A2A_PACKAGE:
            out += _a2a_service(fd)
        if not fd.name.startswith("turnmesh/"):
            continue
        notes = _comments(fd)
        out += [f"## `{fd.name}`", ""]
        for si, service in enumerate(fd.service):
            out += [f"### service `{fd.package}.{service.name}`", ""]
            if text := notes.get((SERVICE, si)):
                out += [text, ""]
            out += ["| RPC | request → response | HTTP | description |", "|---|---|---|---|"]
            for mi, m in enumerate(service.method):
                stream = "stream " if m.server_streaming else ""
                sig = f"`{m.input_type.split('.')[-1]}` → {stream}`{m.output_type.split('.')[-1]}`"
                desc = _one_line(notes.get((SERVICE, si, METHOD, mi), ""))
                out.append(f"| `{m.name}` | {sig} | {_http(m)} | {desc} |")
            out.append("")
        for ei, enum in enumerate(fd.enum_type):
            out += [f"### enum `{enum.name}`", ""]
            if text := notes.get((ENUM, ei)):
                out += [text, ""]
            out += ["| value | number | description |", "|---|---|---|"]
            for vi, v in enumerate(enum.value):
                desc = _one_line(notes.get((ENUM, ei, VALUE, vi), ""))
                out.append(f"| `{v.name}` | {v.number} | {desc} |")
            out.append("")
        for mi, message in enumerate(fd.message_type):
            out += [f"### message `{message.name}`", ""]
            if text := notes.get((MESSAGE, mi)):
                out += [text, ""]
            if not message.field:
                out += ["(no fields)", ""]
                continue
            out += ["| field | JSON | type | description |", "|---|---|---|---|"]
            for fi, f in enumerate(message.field):
                label = "repeated " if f.label == f.LABEL_REPEATED else ""
                ftype = f.type_name.split(".")[-1] if f.type_name else _scalar(f.type)
                desc = _one_line(notes.get((MESSAGE, mi, FIELD, fi), ""))
                out.append(f"| `{f.name}` | `{f.json_name}` | {label}`{ftype}` | {desc} |")
            out.append("")
    out += _errors()
    out += ["", *_differences()]
    return "\n".join(out).rstrip() + "\n"


# What turnmesh does differently from the APIs it speaks and from the seeds'
# contracts, on purpose: (where, the difference, why). Rendered into
# docs/api.md; a difference fixed is a row removed.
DIFFERENCES = [
    (
        "OpenAI chat completions",
        "Without `X-Session-Id` a request runs on a throw-away session, created with the "
        "request's messages as its history and deleted after the answer; with it, the "
        "session keeps the history and the request sends only the new message.",
        "Every turn runs on a session: that is what the mesh routes, limits and fails over.",
    ),
    (
        "OpenAI chat completions",
        "Sampling options (`temperature`, `top_p`, `max_tokens`, `n`, `logprobs`...) are "
        "accepted and not passed to the agent; `n` is always 1, `logprobs` and "
        "`system_fingerprint` are null. `metadata` reaches the agent as the turn's metadata.",
        "The agent owns its model and its settings; the model name picks the agent.",
    ),
    (
        "OpenAI chat completions and Responses",
        "Function tools are the caller's own: the agent may call them (the answer's "
        "`tool_calls` or `function_call` items), or not. `tool_choice` `required` and "
        "`parallel_tool_calls` do not force or limit its calls; `none` offers no tools, a "
        "named function (or `allowed_tools`) only those. Approvals and questions come in an "
        "`interrupts` extension (Responses: an approval is an `mcp_approval_request` item) "
        "and are answered with a `resume` extension (or `mcp_approval_response` items). An "
        "`mcp` tool is accepted only with the agent as `server_label` (the client answers its "
        "approvals); its `server_url`, `headers` and `authorization` are never used. A chat "
        "completion's interrupts are also its message's `function_call` (`name` "
        '`"interrupts"`), not a call to run: langchain keeps it, and drops the extension.',
        "The agent decides what to call; OpenAI's function calling has no approval or "
        "question of its own.",
    ),
    (
        "OpenAI chat completions and Responses",
        "Files are inline only (`file_data`, data: URLs); `file_id` and URLs are refused with 400.",
        "The mesh fetches no URL and has no file store.",
    ),
    (
        "OpenAI chat completions and Responses, AG-UI",
        "A client's disconnect (AG-UI: `abortRun()`) cancels the turn (as OpenAI's does); "
        "`X-Turnmesh-On-Disconnect: continue` lets it finish and be saved.",
        "The opt-out is the native API's resume-after-disconnect.",
    ),
    (
        "OpenAI chat completions and Responses",
        "A turn cancelled or failed on the server is 409 `turn_cancelled` or 400 `turn_failed` "
        "with `x-should-retry: false`, where OpenAI would answer 500.",
        "Sending it again would run it again; the SDKs retry a 500 by default.",
    ),
    (
        "OpenAI Responses",
        "Input items are `message`, `item_reference`, `function_call`, "
        "`function_call_output`, `mcp_approval_request` and `mcp_approval_response`; other "
        "types are 400. With `previous_response_id` the turn's message is the last message "
        "item; earlier messages of that request are not added to the conversation.",
        "A turn takes one user message; a new conversation is seeded with all of them.",
    ),
    (
        "OpenAI Responses",
        "Response ids are `resp_<turn>.<base64url(session)>`, message ids "
        "`msg_<turn>.<base64url(session)>` and approval request ids "
        "`mcpr_<n>_<turn>.<base64url(session)>`; `store: false` is ignored (the session is the "
        "store). A `background` response is polled (`GET /v1/responses/{id}`), not streamed: "
        "`background` with `stream` is 400.",
        "Any server can continue or read a response from its id alone, with no shared index; "
        "a background turn's events are followed natively with `SubscribeTurn`.",
    ),
    (
        "OpenAI Responses",
        "`previous_response_id` naming an older response, or one another continuation is "
        "running after, forks the session there (the fork is seeded through CreateSession: "
        "a message over 100,000 characters cannot be branched past, 400 on "
        "`previous_response_id`); two continuations of the same response arriving at the same "
        "instant may chain instead. One naming a response that saved nothing (cancelled, "
        "failed, still running) continues the session as it is. Each response is its own turn "
        "(ENQUEUE), never coalesced. Item references read at most 8 conversations and "
        "8,000,000 characters a request.",
        "A response that saved nothing has no state of its own to branch from; a fence for "
        "the simultaneous case would need the session's newest turn checked as the turn is "
        "placed.",
    ),
    (
        "OpenAI Responses",
        "`usage` details (`cached_tokens`, `reasoning_tokens`) are 0; `tools` are the "
        "request's function tools as `tool_choice` left them; `temperature`/`top_p` null.",
        "Agents report input and output tokens only.",
    ),
    (
        "OpenAI models",
        "`GET /v1/models` lists the agents a live worker serves; `created` is when this server "
        "first saw the agent, `owned_by` is `turnmesh`.",
        "An agent has no creation date of its own.",
    ),
    (
        "OpenAI paths not served",
        "`/v1/completions`, `/v1/embeddings`, `/v1/files`, `/v1/images/*`, `/v1/audio/*`, "
        "`/v1/moderations`, `/v1/assistants`, `/v1/threads`, `/v1/batches` answer 404 in "
        "OpenAI's error shape.",
        "turnmesh serves agents' turns, not models' other APIs.",
    ),
    (
        "Seed AgentRunnable (`kind: areal`)",
        "`queue_mode` is always `COLLECT`; `history` messages may carry `tool_calls` and "
        "`tool_call_id`; `message` has attached files' text after it; text streamed after the "
        "last tool result is the answer even when `summary` differs; an exception is a generic "
        "`agent_error` (the text stays in the worker's log); no token usage is reported.",
        "A worker is not told the session's policy; history is OpenAI-shaped everywhere; "
        "the caller sees what streamed; exception texts can hold secrets.",
    ),
    (
        "Seed gateway WebSocket (AReaL `/ws`)",
        "`res` accepted comes when the turn starts (behind another socket's turn on the same "
        "session, once that ends), not before; a refusal before the turn starts is `res` "
        "failed alone; `res` failed adds `code`, `res` complete adds `interrupts` for a "
        "pause; tool results are not sent.",
        "The `runId` is the turn's, known once it is placed; the seed's protocol has no pause "
        "and no tool-result event.",
    ),
    (
        "Seed simple chat (HoloDeck)",
        "`tool_calls[].arguments_json` rides beside `arguments` (the object); a tool's status "
        "is `error` when its result starts with `error:` (turnmesh's tools report failures "
        "so); session ids are any valid id, not only ULIDs.",
        "The raw text keeps arguments that are not a JSON object; an event has no error flag.",
    ),
    (
        "Seed simple chat (HoloDeck)",
        "Multipart forms: fields other than `message`, `session_id`, `agent_name` and `files` "
        "are ignored; a `files` part without a `Content-Type` is `application/octet-stream` "
        "(refused by the MIME list); `application/x-www-form-urlencoded` is not a form here.",
        "HoloDeck's spec names multipart for uploads; a request without files is sent as JSON.",
    ),
    (
        "Seed simple chat (HoloDeck)",
        "A file's base64 `content` is also accepted unpadded and URL-safe; `tokens_used` is "
        "absent (not `null`) when the agent reported no usage.",
        "The edge decodes `bytes` fields before the server sees the text (Envoy's "
        "transcoder is lenient); it prints no `null` for an unset object.",
    ),
    (
        "Seed simple chat (HoloDeck)",
        "Health in HoloDeck's shape is `GET /v1/chat/health`; `/health` stays the native one.",
        "The native `status` is a lifecycle state, not healthy|unhealthy.",
    ),
    (
        "Seed ProblemDetail",
        "`type` is a `https://turnmesh.dev/problems/...` URL, never `about:blank`; problems "
        "add `grpc_code`, `reason` and `violations`.",
        "One error table names every problem, for REST and gRPC alike.",
    ),
    (
        "A2A",
        "A task's `history` holds its own messages, not its context's earlier tasks'.",
        "Each earlier message of the context belongs to a task of its own, read by its id.",
    ),
    (
        "A2A",
        "Tool calls and results are data parts (`toolCall`, `toolResult`) of the agent's "
        "messages, and of WORKING status updates while a task streams.",
        "A2A has no tool events; a data part keeps them structured.",
    ),
    (
        "A2A",
        "Quotas, rate limits and a reused `messageId` keep the mesh's own errors (429 with "
        "`Retry-After`, 409), and an unknown tenant is 404: not A2A reasons.",
        "A2A has no error for them; the mesh's say what to do (wait, or send another id).",
    ),
]


def _differences() -> list[str]:
    out = [
        "## Deliberate differences from OpenAI and the seeds",
        "",
        "| where | difference | why |",
        "|---|---|---|",
    ]
    out += [f"| {where} | {what} | {why} |" for where, what, why in DIFFERENCES]
    return out


# Problem types and titles that changed when the error table became the one
# source (issue 15): (what a caller got before, what it gets now).
CHANGED_TYPES = [
    ('`aborted` ("Conflict") for a busy session', '`session-busy` ("Session busy")'),
    (
        '`resource-exhausted` ("Too many requests") for an API key\'s rate limit',
        '`rate-limited` ("Rate limit exceeded")',
    ),
    ("`service-unavailable` (Envoy: no healthy server)", '`unavailable` ("Service unavailable")'),
    ("`bad-request` (Envoy's own 400)", '`invalid-argument` ("Invalid request")'),
    ("`authentication-required` (Envoy's own 401)", "`unauthenticated`"),
    ("`forbidden` (Envoy's own 403)", '`permission-denied` ("Permission denied")'),
    ("`too-many-requests` (Envoy's own 429)", "`resource-exhausted`"),
    ("`internal-error` (Envoy's own 500)", "`internal`"),
    ("`gateway-timeout` (Envoy's own 504)", '`deadline-exceeded` ("Deadline exceeded")'),
    (
        "OpenAI paths, Envoy's own 401 and 403: `invalid_request_error`",
        "`authentication_error` and `permission_error`, as the rows say",
    ),
    ("OpenAI paths, Envoy's own 499: `invalid_request_error`", "`server_error`"),
    (
        "HTTP 500 `server_error` on the OpenAI, AG-UI and chat surfaces for a full server "
        "(the session and turn limits) and for the other codes their client did not know",
        "HTTP 429 with `Retry-After` (`rate_limit_error`), like the native API",
    ),
]


def _errors() -> list[str]:
    """The error table of turnmesh.runtime.errors, as callers see it."""
    out = [
        "## Errors",
        "",
        "Every error has a gRPC status with `google.rpc` details (`ErrorInfo` with the reason "
        "below, `BadRequest` for invalid arguments). Over REST it is "
        "`application/problem+json` with `type` = "
        f"`{errors.PROBLEM_BASE}<slug>`, `title`, `status`, `detail`, `grpc_code`, `reason`, "
        "`violations` and `instance` (the request's id, also its `X-Request-Id` response "
        "header, in the edge's access log and in the log line of the turn it started); "
        "on OpenAI's paths it is OpenAI's "
        '`{"error": {message, type, param, code}}` with `code` the reason in lower case. '
        "Rows with `Retry-After` send it as trailing metadata and as the HTTP header. "
        "Generated from `runtime/errors.py` (Envoy's own replies: `envoy/edge_rows.py`).",
        "",
        "| gRPC code | reason | HTTP | problem type (slug) | title | OpenAI type |",
        "|---|---|---|---|---|---|",
    ]
    for row in errors.rows():
        kind = errors.kind_for(row.code, row.reason)
        retry = " (Retry-After)" if kind.default_retry_after is not None else ""
        out.append(
            f"| `{row.code.name}` | `{row.reason}` | {row.http_status}{retry} | `{row.slug}` "
            f"| {row.title} | `{row.openai_type}` |"
        )
    out += [
        "",
        "Envoy's own replies (it never asked a server) use the same types: "
        + ", ".join(
            f"{status} `{slug}`" for status, (slug, _, _) in edge_rows.edge_problems().items()
        )
        + f"; any other status `{edge_rows.EDGE_FALLBACK[0]}`.",
        "",
        "No error's text is Python's own: every status leaves a server through one boundary "
        "(`runtime/interceptors.py`), which sends a text that reads like an exception's "
        "(`runtime/sanitize.py`) as the row's title instead and logs the original. gRPC core "
        "answers a few malformed calls before turnmesh's code sees them, with its own short "
        "message and nothing changed: a message whose compressed flag is set with no "
        "`grpc-encoding`, one its `grpc-encoding` cannot decode, or a `grpc-encoding` it does "
        'not know is `INTERNAL` ("Compression bit set but no encoding configured", '
        '"Decompression failed due to zlib error", "Error parsing \'grpc-encoding\' '
        'metadata"); a message over the size limit is `RESOURCE_EXHAUSTED` without '
        "`Retry-After`.",
        "",
        "A turn that fails after its first event ends with `RUN_ERROR`, whose `code` and "
        "`problem` say why:",
        "",
        "| code | problem type (slug) | title | status |",
        "|---|---|---|---|",
    ]
    for error in turn_errors.TurnError:
        slug = error.code.replace("_", "-")
        out.append(f"| `{error.code}` | `{slug}` | {error.title} | {error.status} |")
    out += [
        "",
        "Agents add codes of their own (`AgentError`, e.g. `model_error`).",
        "",
        *_one_piece_errors(),
        "",
        "### Problem types that changed",
        "",
        "| before | now |",
        "|---|---|",
        *(f"| {before} | {now} |" for before, now in CHANGED_TYPES),
    ]
    return out


def _one_piece_errors() -> list[str]:
    """How a surface that answers in one piece (non-streamed chat completions
    and Responses, `/v1/chat`) reports a RUN_ERROR: rendered from the code
    that maps it, so it cannot drift."""
    from turnmesh.runtime.turn_errors import turn_error

    out = [
        "A surface that answers in one piece (chat completions and Responses without "
        "`stream`, `/v1/chat`) answers a turn that ended in `RUN_ERROR` with an HTTP error "
        "instead; the session's history is unchanged in every case. Only the mesh's own "
        "faults are worth the OpenAI SDKs' automatic retry (they retry 408, 409, 429 and "
        "5xx unless `x-should-retry: false` says otherwise); the RUN_ERROR's code is in "
        "`ErrorInfo.metadata.cause`:",
        "",
        "| RUN_ERROR code | HTTP | reason (OpenAI `code`) | `x-should-retry` |",
        "|---|---|---|---|",
    ]
    codes = [(e.code, e.event("")) for e in turn_errors.TurnError]
    codes.append(("an agent's own", turn_errors.error_event("model_error", "", 502, "")))
    for code, event in codes:
        error = turn_error(event)
        retry = dict(error.trailers).get("x-should-retry", "(absent: retried)")
        name = code if code.startswith("an ") else f"`{code}`"
        out.append(f"| {name} | {error.http_status} | `{error.reason}` | {retry} |")
    return out


def _scalar(type_number: descriptor_pb2.FieldDescriptorProto.Type.ValueType) -> str:
    name = descriptor_pb2.FieldDescriptorProto.Type.Name(type_number)
    return name.removeprefix("TYPE_").lower()


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "api.md"
    fds = descriptor_pb2.FileDescriptorSet.FromString(
        (ROOT / "gen" / "turnmesh" / "v1" / "turnmesh.binpb").read_bytes()
    )
    out.write_text(render(fds))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
