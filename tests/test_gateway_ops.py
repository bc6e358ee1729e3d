"""Operations and documents: health, readiness, metrics, the OpenAPI document, the web page, and the
`python -m vidjobs.gateway` process itself."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_harness import assert_error, gateway_settings, running_gateway
from tests.support import wait_process_ready, wait_until
from tests.test_gateway_jobs import API_JOB_KEYS
from vidjobs.cli.embedded import free_port
from vidjobs.gateway.app import route_table


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def test_health_and_readiness(h):
    assert (await h.get(None, "/healthz")) == (200, {"status": "ok"})
    assert (await h.get(None, "/readyz")) == (200, {"status": "ready"})


async def test_readiness_follows_nats(h, nats_server):
    nats_server.stop()

    async def answers(status: int) -> bool:
        return (await h.get(None, "/readyz"))[0] == status

    await wait_until(lambda: answers(503), within=15, what="/readyz to report NATS down")
    _, body = await h.get(None, "/readyz")
    assert_error(body, "not_ready", "NATS")
    nats_server.start()  # same port: the client reconnects by itself
    await wait_until(lambda: answers(200), within=15, what="/readyz to recover")


async def test_metrics_count_requests_by_route_not_by_path(h):
    key = await h.key()
    await h.get(key, "/v1/jobs/job_a")
    await h.get(key, "/v1/jobs/job_b")

    resp = await h.client.get("/metrics")
    text = await resp.text()

    assert resp.status == 200
    samples = {tuple(sorted(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) if family.name == "vidjobs_http_requests"
               for s in family.samples if s.name == "vidjobs_http_requests_total"}
    assert samples[(("method", "GET"), ("route", "get_job"), ("status", "404"))] >= 2
    assert "job_a" not in text


async def test_openapi_lists_every_route_with_the_contract_fields(h):
    status, doc = await h.get(None, "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")

    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    served = {(r.method, re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", r.path))
              for r in route_table(h.settings) if r.documented}
    assert documented == served
    for method, path in [("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job_id}"),
                         ("POST", "/v1/jobs/{job_id}/cancel"), ("DELETE", "/v1/jobs/{job_id}"),
                         ("GET", "/v1/jobs/{job_id}/events"), ("GET", "/v1/jobs/{job_id}/stream"),
                         ("GET", "/v1/account"), ("GET", "/v1/account/ledger"), ("POST", "/v1/webhooks/{provider}"),
                         ("GET", "/healthz"),
                         ("GET", "/readyz"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                         ("GET", "/v1/models"), ("POST", "/v1/estimates"), ("POST", "/v1/webhook-endpoints"),
                         ("GET", "/v1/webhook-endpoints/{endpoint_id}/deliveries")]:
        assert (method, path) in documented, (method, path)

    schemas = doc["components"]["schemas"]
    assert set(schemas["JobOut"]["properties"]) == API_JOB_KEYS
    assert set(schemas["CreateJob"]["properties"]) == {
        "model", "prompt", "duration_s", "aspect_ratio", "resolution", "seed", "negative_prompt", "input_image",
        "params", "metadata", "webhook_url", "webhook_events", "fallback_models", "max_wait_s", "priority"}
    assert set(schemas["ErrorBody"]["properties"]) == {"code", "message", "retryable", "request_id"}
    undescribed = [f"{name}.{field}" for name, schema in schemas.items()
                   for field, prop in schema.get("properties", {}).items()
                   if "description" not in prop and not any("description" in s for s in prop.get("anyOf", []))]
    assert undescribed == []  # a field's comment in the code is its description
    codes = set(schemas["ErrorBody"]["properties"]["code"]["enum"])
    assert {"invalid_input", "quota_exhausted", "rate_limited", "not_found", "limit_reached"} <= codes
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, answer in op["responses"].items():
                assert "X-Request-Id" in answer["headers"], (method, path, status)
                assert ("RateLimit" in answer["headers"]) == bool(op["security"]), (method, path, status)
    stream = doc["paths"]["/v1/jobs/{job_id}/stream"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    assert stream["itemSchema"] == {"$ref": "#/components/schemas/JobOut"}
    assert doc["servers"] and schemas["CreateJob"]["properties"]["prompt"]["examples"]
    create = doc["paths"]["/v1/jobs"]["post"]["responses"]
    assert "Idempotent-Replayed" in create["200"]["headers"] and "Retry-After" in create["429"]["headers"]
    assert set(schemas["JobStatus"]["enum"]) == {"pending", "submitted", "processing", "retrying", "downloading",
                                                 "completed", "failed", "canceled", "expired"}
    assert set(schemas["TransitionOut"]["properties"]) == {"from", "to", "stage", "at", "reason"}
    assert doc["paths"]["/v1/webhooks/{provider}"]["post"]["security"] == []
    # Every request made with a key spends from its rate, so it can hear 429; of the others, only a provider's
    # callback has a rate (per provider).
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            rated = bool(op["security"]) or path == "/v1/webhooks/{provider}"
            assert ("429" in op["responses"]) == rated, (method, path)
    assert set(schemas["AccountOut"]["properties"]) == {
        "id", "name", "credits", "limits", "spent_today", "active_jobs", "queued_jobs", "uploads_today",
        "fallback_models", "storage"}


async def test_a_production_deployment_refuses_fake_models_and_keeps_metrics_off_the_api_port(
        tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, fake_provider="off", api_metrics="off",
                                metrics_port=free_port())
    async with running_gateway(settings) as prod:
        key = await prod.key()
        status, body = await prod.post_job(key)
        assert status == 422
        assert_error(body, "invalid_input", "unknown provider 'fake'")
        resp = await prod.client.post("/v1/webhooks/fake", data=b"{}", headers={"Content-Type": "application/json"})
        assert resp.status == 404
        assert (await prod.client.get("/metrics")).status == 404
        doc = (await prod.get(None, "/openapi.json"))[1]
        assert "/metrics" not in doc["paths"]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{settings.metrics_port}/metrics") as resp:
                assert resp.status == 200
                assert "vidjobs_http_requests_total" in await resp.text()
            async with http.get(f"http://127.0.0.1:{settings.metrics_port}/readyz") as resp:
                assert resp.status == 200


async def test_the_page_and_its_assets_are_served(h):
    resp = await h.client.get("/")
    html = await resp.text()
    assert resp.status == 200 and resp.content_type == "text/html"
    assert "/static/app.js" in html and "Render" in html
    assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
    script = await h.client.get("/static/app.js")
    assert script.status == 200 and "/stream" in await script.text()
    assert (await h.client.get("/static/style.css")).status == 200
    for name in ["index.html.bak", "..%2Fapp.py", "__init__.py"]:
        assert (await h.client.get(f"/static/{name}")).status == 404


async def test_the_process_serves_and_stops_cleanly_on_sigterm(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidjobs.gateway", env={**os.environ, **settings.to_env()},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_process_ready(settings.gateway_url, proc)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_bad_setting_exits_2_naming_the_variable():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidjobs.gateway", env={**os.environ, "VIDJOBS_HTTP_PORT": "eighty"},
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"VIDJOBS_HTTP_PORT" in err


def test_the_reference_page_is_the_served_document():
    """docs/API.md is written from the OpenAPI document; regenerate it when a route or body changes:
    `python -m vidjobs.gateway.apidoc > docs/API.md`."""
    from vidjobs.gateway.apidoc import reference

    assert (Path(__file__).parents[1] / "docs" / "API.md").read_text() == reference()
