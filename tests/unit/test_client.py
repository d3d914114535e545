"""The typed clients' public surface: pinned exports, and a blocking client
whose every call matches the async one's, parameter for parameter."""

from __future__ import annotations

import inspect
import typing

import turnmesh.client
from turnmesh.client import AsyncClient, Client, TurnOptions


def test_public_names_are_pinned() -> None:
    assert turnmesh.client.__all__ == [
        "AbortedError",
        "AlreadyExistsError",
        "AsyncClient",
        "AwaitingClientError",
        "Client",
        "DeadlineExceededError",
        "EventStream",
        "FailedPreconditionError",
        "IdempotencyKeyReusedError",
        "InvalidArgumentError",
        "NoLiveWorkerError",
        "NotFoundError",
        "NotWaitingError",
        "OutOfRangeError",
        "PermissionDeniedError",
        "Policy",
        "PolicyName",
        "RateLimitedError",
        "RequestCancelledError",
        "ResourceExhaustedError",
        "SessionBusyError",
        "SessionQuotaExceededError",
        "TurnAlreadyFinishedError",
        "TurnFailedError",
        "TurnNotFoundError",
        "TurnOptions",
        "TurnQuotaExceededError",
        "TurnResult",
        "TurnmeshClientError",
        "UnauthenticatedError",
        "UnavailableError",
        "UnimplementedError",
        "approve",
        "resume",
        "tool",
        "tool_result",
    ]
    assert sorted(turnmesh.client.__all__) == turnmesh.client.__all__
    assert Client.__module__ == AsyncClient.__module__ == "turnmesh.client"
    assert turnmesh.client.NotFoundError.__module__ == "turnmesh.client"
    assert turnmesh.client.approve.__module__ == "turnmesh.client"


def test_pause_helpers_build_the_protos() -> None:
    weather = turnmesh.client.tool("get_weather", "the weather", {"type": "object"})
    assert (weather.name, weather.description) == ("get_weather", "the weather")
    assert weather.parameters["type"] == "object"
    assert not turnmesh.client.tool("t").HasField("parameters")
    result = turnmesh.client.tool_result("c1", error="timed out")
    assert (result.tool_call_id, result.content, result.error) == ("c1", "", "timed out")
    granted = turnmesh.client.approve("i1")
    assert (granted.interrupt_id, granted.status) == ("i1", "resolved")
    assert granted.payload.struct_value["approved"] is True
    assert turnmesh.client.approve("i1", False).payload.struct_value["approved"] is False
    answered = turnmesh.client.resume("i2", {"color": "green"})
    assert answered.payload.struct_value["color"] == "green"
    assert turnmesh.client.resume("i3", "yes").payload.string_value == "yes"
    dropped = turnmesh.client.resume("i4", status="cancelled")
    assert dropped.status == "cancelled" and not dropped.HasField("payload")


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") or name == "__init__"
    }


def _parameters(signature: inspect.Signature) -> list[tuple[str, object, object, object]]:
    return [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()]


def test_the_blocking_client_has_the_async_clients_calls() -> None:
    sync, asynchronous = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(asynchronous)
    for name, signature in asynchronous.items():
        if name == "__init__":
            # The channel is each client's own kind (grpc.Channel, grpc.aio.Channel).
            mine = [p for p in _parameters(signature) if p[0] != "channel"]
            theirs = [p for p in _parameters(sync[name]) if p[0] != "channel"]
            assert mine == theirs
            assert "channel" in sync[name].parameters
            continue
        assert _parameters(sync[name]) == _parameters(signature), name


def test_turn_options_are_typed_keywords() -> None:
    assert typing.get_type_hints(TurnOptions).keys() == {
        "policy",
        "cancel_on_disconnect",
        "files",
        "metadata",
        "idempotency_key",
        "tools",
        "tool_results",
        "resume",
        "webhook_url",
    }
    for cls in (Client, AsyncClient):
        for method in ("stream_turn", "send"):
            parameters = inspect.signature(getattr(cls, method)).parameters
            (options,) = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
            # **options: Unpack[TurnOptions]: a type checker knows each keyword.
            assert options.annotation == "Unpack[TurnOptions]"


def test_the_error_tree_in_the_docstring_is_the_class_tree() -> None:
    """Each client error class stands in the drawn tree under its parent."""
    from turnmesh.client import errors

    doc = errors.__doc__ or ""
    drawn: dict[str, tuple[int, str]] = {}  # name -> (depth, parent)
    stack: list[str] = []
    for line in doc.splitlines():
        words = line.replace("│", " ").replace("├──", "   ").replace("└──", "   ").split()
        if not words or not words[0].endswith("Error"):
            continue
        depth = (len(line) - len(line.lstrip(" │├└─")) - 4) // 4
        del stack[depth:]
        drawn[words[0]] = (depth, stack[-1] if stack else "")
        stack.append(words[0])
    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.TurnmeshClientError)
    }
    assert set(drawn) == set(classes)
    for name, cls in classes.items():
        parent = cls.__bases__[0].__name__
        assert drawn[name][1] == ("" if cls is errors.TurnmeshClientError else parent), name
