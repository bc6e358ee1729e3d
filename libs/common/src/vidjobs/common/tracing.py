"""Traces across gateway → NATS → workers → provider calls, when an OTLP endpoint is configured.

Off by default. Setting the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
turns it on, with the `tracing` extra installed (`pip install 'vidjobs[tracing]'`); the other `OTEL_*`
variables (headers, sampling, batch delay) work as the OpenTelemetry SDK documents them. Without an endpoint
nothing of OpenTelemetry is imported and every hook here is a no-op.

One request, one trace. The request id already travels with every message a request causes (the
`Vidjobs-Request-Id` header) and stays on the job's row for work no client asked for (a callback, a recovery
check). The trace id and the root span id are derived from it, so every service puts its spans under the
gateway's span for that request without a new column or header, and a job's later work joins the trace of
the request that created it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import aiohttp

from vidjobs.common import requestids

log = logging.getLogger("vidjobs.tracing")

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_tracer: Any = None  # an OpenTelemetry Tracer once set up; None while tracing is off
_provider: Any = None
_root_of: ContextVar[str | None] = ContextVar("vidjobs_trace_root_of", default=None)


def ids(request_id: str) -> tuple[int, int]:
    """The trace id and root span id of a request: the same in every service."""
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def wanted() -> bool:
    return any(os.environ.get(name) for name in _ENDPOINTS) and \
        os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def setup(service: str) -> bool:
    """Start exporting this process's spans, if an endpoint is configured; whether tracing is on."""
    global _tracer, _provider
    if not wanted():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("an OTLP endpoint is set but tracing is not installed: pip install 'vidjobs[tracing]'")
        return False
    _provider = TracerProvider(resource=Resource.create({"service.name": f"vidjobs-{service}"}),
                               id_generator=_request_ids())
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = _provider.get_tracer("vidjobs")
    log.info("tracing on", extra={"endpoint": next(os.environ[n] for n in _ENDPOINTS if os.environ.get(n))})
    return True


def shutdown() -> None:
    """Send what is buffered; at exit."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _request_ids() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RequestIds(RandomIdGenerator):
        """The root span of a request gets the ids derived from its request id; every other span, random."""

        def generate_trace_id(self) -> int:
            root_of = _root_of.get()
            return ids(root_of)[0] if root_of else super().generate_trace_id()

        def generate_span_id(self) -> int:
            root_of = _root_of.get()
            return ids(root_of)[1] if root_of else super().generate_span_id()

    return RequestIds()


def _under_request(request_id: str | None) -> Any:
    """A context whose parent is the request's root span (which another process may have made)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    if not request_id:
        return None
    trace_id, span_id = ids(request_id)
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextlib.contextmanager
def request_span(name: str, request_id: str, **attributes: Any) -> Iterator[Any]:
    """The gateway's span for one HTTP request: the root of the request's trace."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    token = _root_of.set(request_id)
    try:
        span = _tracer.start_span(name, context=context.Context(), kind=SpanKind.SERVER, attributes=attributes)
    finally:
        _root_of.reset(token)
    with trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
        yield span


@contextlib.contextmanager
def handling_span(name: str, **attributes: Any) -> Iterator[Any]:
    """A worker's span for handling one message, under the root span of the request that caused it."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    clean = {key: value for key, value in attributes.items() if value is not None}
    with _tracer.start_as_current_span(name, context=_under_request(requestids.current()), kind=SpanKind.CONSUMER,
                                       attributes=clean) as span:
        yield span


def client_trace_configs() -> list[aiohttp.TraceConfig]:
    """For an aiohttp session that calls providers: a client span per request, in the current trace."""
    if _tracer is None:
        return []
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    config = aiohttp.TraceConfig()

    async def started(_: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
        parent = None if trace.get_current_span().get_span_context().is_valid else \
            _under_request(requestids.current())
        ctx.span = _tracer.start_span(f"{params.method} {params.url.host}", context=parent, kind=SpanKind.CLIENT,
                                      attributes={"http.request.method": params.method,
                                                  "server.address": params.url.host or "",
                                                  "url.path": params.url.path})

    async def ended(_: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
        ctx.span.set_attribute("http.response.status_code", params.response.status)
        if params.response.status >= 500:
            ctx.span.set_status(Status(StatusCode.ERROR))
        ctx.span.end()

    async def failed(_: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceRequestExceptionParams) -> None:
        ctx.span.record_exception(params.exception)
        ctx.span.set_status(Status(StatusCode.ERROR, type(params.exception).__name__))
        ctx.span.end()

    config.on_request_start.append(started)
    config.on_request_end.append(ended)
    config.on_request_exception.append(failed)
    return [config]
