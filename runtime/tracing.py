"""OpenTelemetry tracing: one trace per turn across Envoy, servers and workers.

Every hop carries W3C ``traceparent`` in gRPC metadata. A server span starts
for each public RPC (a child of Envoy's span, or of the caller's own
``traceparent``), and for internal RPCs only when the caller sent a parent, so
heartbeats and health checks never start traces of their own. Spans go out
over OTLP/gRPC when an endpoint is configured; without one the API's no-op
tracer still forwards the caller's context, at almost no cost.

The hop glue is written here rather than taken from
``opentelemetry-instrumentation-grpc``: its asyncio client interceptors wrap
every call on a channel (heartbeats included), and our turns need spans at
exactly three points (server RPC, worker call, worker RPC) with turn ids on them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from turnmesh.runtime.handlers import (
    Continuation,
    MethodHandler,
    ServerInterceptor,
    ServicerContext,
    Stream,
    Unary,
    wrap,
)

log = logging.getLogger(__name__)

tracer = trace.get_tracer("turnmesh")

Metadata = tuple[tuple[str, str], ...]
# Methods whose calls never start or continue a trace: health checks and
# probes (a load balancer's every few seconds), reflection.
UNTRACED_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.",
    "/turnmesh.v1.SessionService/GetHealth",
    "/turnmesh.v1.SessionService/GetReadiness",
    "/turnmesh.v1.CompatService/GetChatHealth",
)
PROPAGATED = frozenset({"traceparent", "tracestate"})
_exporting = False  # set once an exporter is installed


def otlp_endpoint(configured: str | None) -> str | None:
    """The flag, else OpenTelemetry's own environment variables."""
    return (
        configured
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def setup_tracing(component: str, endpoint: str | None) -> Callable[[], None]:
    """Export spans to an OTLP/gRPC collector; returns the flush-and-stop hook."""
    endpoint = otlp_endpoint(endpoint)
    if not endpoint:
        return lambda: None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"turnmesh-{component}"}))
    insecure = not endpoint.startswith("https://")
    # A short export timeout: a collector that is down must not hold up a drain.
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=2)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    global _exporting
    _exporting = True
    log.info("exporting traces to %s", endpoint)

    def stop() -> None:
        provider.force_flush(timeout_millis=1000)
        provider.shutdown()

    return stop


def trace_id(ctx: otel_context.Context) -> str | None:
    """The trace id (hex) of a context, for logs; None outside a trace."""
    span_context = trace.get_current_span(ctx).get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def extract(metadata: Any) -> otel_context.Context:
    carrier = {k: v for k, v in metadata or () if k in PROPAGATED and isinstance(v, str)}
    return propagate.extract(carrier)


def inject(ctx: otel_context.Context | None = None) -> Metadata:
    """``traceparent`` (and ``tracestate``) for an outgoing call."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return tuple(carrier.items())


@contextmanager
def client_span(
    name: str, parent: otel_context.Context | None, **attributes: str
) -> Iterator[Metadata]:
    """A CLIENT span for an outgoing call under ``parent``; yields the
    metadata that makes the callee's span its child."""
    with tracer.start_as_current_span(
        name, context=parent, kind=SpanKind.CLIENT, attributes=attributes
    ):
        yield inject()


def _rpc_attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


class TracingInterceptor(ServerInterceptor):
    """A SERVER span around each traced RPC, current while it runs."""

    def __init__(self, root_prefixes: tuple[str, ...] = ()) -> None:
        # RPCs under these prefixes start a trace when the caller sent none.
        self._roots = root_prefixes

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(UNTRACED_PREFIXES):
            return handler
        metadata = handler_call_details.invocation_metadata or ()
        has_parent = any(k == "traceparent" for k, _ in metadata)
        # Without a parent, a span is worth starting only if it is exported.
        if not has_parent and not (_exporting and method.startswith(self._roots)):
            return handler
        name = method.lstrip("/")
        attributes = _rpc_attributes(method)

        def span(context: ServicerContext) -> Any:
            return tracer.start_as_current_span(
                name,
                context=extract(context.invocation_metadata()),
                kind=SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,  # exception text stays out of traces too
                set_status_on_exception=False,
            )

        # The request is handed on, not kept: an aborted call's frames stay
        # in a reference cycle with grpc's state of the call, theirs too.
        def unary(inner: Unary) -> Unary:
            async def traced(request: Any, context: ServicerContext) -> Any:
                with span(context) as current:
                    answer = inner(request, context)
                    del request
                    try:
                        return await answer
                    finally:
                        _finish(current, context)

            return traced

        def stream(inner: Stream) -> Stream:
            async def traced(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
                with span(context) as current:
                    items = inner(request, context)
                    del request
                    try:
                        async for item in items:
                            yield item
                    finally:
                        _finish(current, context)

            return traced

        return wrap(handler, unary, stream)


def _finish(span: trace.Span, context: ServicerContext) -> None:
    # Not a StatusCode until the handler set one (a handler that returned normally).
    code: object = context.code()
    status = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK
    span.set_attribute("rpc.grpc.status_code", status.value[0])
    if status not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
        span.set_status(Status(StatusCode.ERROR, status.name))
