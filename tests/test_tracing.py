"""Traces across the services, through the real stack: with an OTLP endpoint set, one job's work in the
gateway, the submitter, the poller or media and the calls to the provider land in one trace, under the
gateway's span for the request that created it. Without an endpoint nothing is exported (and nothing of
OpenTelemetry is loaded by the services)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.stack import running_stack, stack_settings
from tests.standins.server import serving
from tests.support import wait_until
from vidjobs.common import tracing


class Collector:
    """An OTLP/HTTP endpoint: what every service exported, as (service, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []

    async def receive(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            service = next(a.value.string_value for a in resource_spans.resource.attributes
                           if a.key == "service.name")
            for scope in resource_spans.scope_spans:
                self.spans += [(service, span) for span in scope.spans]
        return web.Response(status=200, content_type="application/x-protobuf")


@asynccontextmanager
async def collector() -> AsyncIterator[tuple[Collector, str]]:
    sink = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", sink.receive)
    async with serving(app) as url:
        yield sink, url


async def test_one_job_is_one_trace_across_the_services(tmp_path, database_url, nats_url, monkeypatch):
    async with collector() as (sink, endpoint):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within a moment, not every 5 s
        async with running_stack(stack_settings(tmp_path, database_url, nats_url)) as stack:
            async with stack.session.post(f"{stack.url}/v1/jobs", headers=stack.auth,
                                          json={"model": "fake/default", "prompt": "a traced fox",
                                                "duration_s": 1}) as resp:
                job = await resp.json()
                request_id = resp.headers["X-Request-Id"]
            await stack.wait_for_status(job["id"], "completed")
            trace_id = tracing.ids(request_id)[0].to_bytes(16, "big")

            def in_trace() -> dict[str, list]:
                by_service: dict[str, list] = {}
                for service, span in sink.spans:
                    if span.trace_id == trace_id:
                        by_service.setdefault(service, []).append(span)
                return by_service

            wanted = {"vidjobs-gateway", "vidjobs-submitter", "vidjobs-media"}
            found = await wait_until(lambda: _ready(in_trace(), wanted), within=30,
                                     what="spans of the gateway, submitter and media in the request's trace")

    root_id = tracing.ids(request_id)[1].to_bytes(8, "big")
    [root] = [s for s in found["vidjobs-gateway"] if s.span_id == root_id]
    assert root.name == "POST create_job" and not root.parent_span_id
    # The workers' handlings hang under the request's root span; the provider calls under a handling.
    handlings = [s for service in ("vidjobs-submitter", "vidjobs-media") for s in found[service]
                 if s.name.startswith("handle ")]
    assert handlings and all(s.parent_span_id == root_id for s in handlings)
    handling_ids = {s.span_id for s in handlings}
    submits = [s for s in found["vidjobs-submitter"] if s.name.startswith("POST ")]
    assert submits and all(s.parent_span_id in handling_ids for s in submits)
    assert any(a.key == "vidjobs.job_id" and a.value.string_value == job["id"]
               for s in handlings for a in s.attributes)


async def _ready(by_service: dict[str, list], wanted: set[str]) -> dict[str, list] | None:
    return by_service if wanted <= by_service.keys() else None


def test_without_an_endpoint_tracing_stays_off(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.setup("test") is False
    with tracing.request_span("GET x", "req_1") as span:
        assert span is None
    assert tracing.client_trace_configs() == []


@pytest.mark.parametrize("request_id", ["req_0123456789abcdef01234567", "client-chosen:id"])
def test_every_service_derives_the_same_ids_from_a_request_id(request_id):
    trace_id, span_id = tracing.ids(request_id)
    assert tracing.ids(request_id) == (trace_id, span_id)
    assert 0 < trace_id < 2**128 and 0 < span_id < 2**64
    assert tracing.ids(request_id + "x") != (trace_id, span_id)

