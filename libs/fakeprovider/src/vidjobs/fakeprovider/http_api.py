"""The fake provider's HTTP API (JSON unless said otherwise; errors are `{"error": {"code", "message", "param"}}`):

  POST /v1/renders                   start a render; `Idempotency-Key` honoured (201 new, 200 replayed)
  GET  /v1/renders?idempotency_key=&job_id=   `{"data": [render, ...]}`
  GET  /v1/renders/{id}              one render
  POST /v1/renders/{id}/cancel       the render, canceled unless it had already finished
  GET  /outputs/{id}.mp4             the rendered clip (video/mp4)
  GET  /v1/_counters                 what was asked for and done, so tests can prove nothing ran twice
  GET|PUT /v1/_weather               the whole provider's behaviour: slow, refusing, callbacks twice or late
  GET  /healthz

Outputs are served by outputs.py: padded to `params.output_mb`, paced, or stalled, as a render's params ask.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from vidjobs.fakeprovider import outputs
from vidjobs.fakeprovider.scenarios import FakeProvider, RenderRecord, refused_account
from vidjobs.fakeprovider.weather import decode_weather, weather_the_call
from vidjobs.fakeprovider.wire import ApiFailure, RenderList, Scenario, decode_render

PROVIDER = web.AppKey("provider", FakeProvider)


def _json(struct: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(struct), status=status, content_type="application/json",
                        headers=headers)


def _record(request: web.Request) -> RenderRecord:
    rec = request.app[PROVIDER].renders.get(request.match_info["render_id"])
    if rec is None:
        raise ApiFailure(404, "not_found", "No such render.", param="id")
    _refuse_revoked([rec])
    return rec


def _refuse_revoked(found: list[RenderRecord]) -> None:
    """key_revoked: every call about its render after the submit meets a refused key."""
    if any(rec.scenario is Scenario.KEY_REVOKED for rec in found):
        raise refused_account(Scenario.KEY_REFUSED)


async def create_render(request: web.Request) -> web.Response:
    fp = request.app[PROVIDER]
    req = decode_render(await request.read())
    rec, replayed = fp.submit(req, request.headers.get("Idempotency-Key") or None)
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    if not replayed and fp.loses_answer(rec):
        await _lose_answer(request, rec)
    return _json(fp.view(rec), status=200 if replayed else 201, headers=headers)


async def _lose_answer(request: web.Request, rec: RenderRecord) -> None:
    """The render is accepted either way; what the caller hears of it is what these scenarios spoil."""
    if rec.scenario is Scenario.ACCEPT_THEN_TIMEOUT:
        await asyncio.sleep(rec.request.params.answer_after_s)
        return
    if request.transport is not None:
        request.transport.abort()
    raise ConnectionResetError("the answer to this submit is dropped on purpose")


async def list_renders(request: web.Request) -> web.Response:
    fp = request.app[PROVIDER]
    key, job_id = request.query.get("idempotency_key"), request.query.get("job_id")
    found = [rec for rec in fp.renders.values()
             if key in (None, rec.idempotency_key) and job_id in (None, rec.request.metadata.job_id)]
    _refuse_revoked(found)
    return _json(RenderList(data=[fp.view(rec) for rec in found]))


async def get_render(request: web.Request) -> web.Response:
    return _json(request.app[PROVIDER].view(_record(request)))


async def cancel_render(request: web.Request) -> web.Response:
    fp, rec = request.app[PROVIDER], _record(request)
    fp.cancel(rec)
    return _json(fp.view(rec))


async def get_output(request: web.Request) -> web.StreamResponse:
    # A HEAD neither counts nor uses up an expiring output.
    rec, clip = await request.app[PROVIDER].output(request.match_info["render_id"], counting=request.method == "GET")
    return await outputs.serve(request, clip, rec.request.params)


async def get_counters(request: web.Request) -> web.Response:
    return _json(request.app[PROVIDER].counters)


async def get_weather(request: web.Request) -> web.Response:
    return _json(request.app[PROVIDER].weather)


async def put_weather(request: web.Request) -> web.Response:
    request.app[PROVIDER].weather = decode_weather(await request.read())
    return await get_weather(request)


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "service": "fake-provider"})


def _failure(failure: ApiFailure) -> web.Response:
    return web.json_response(failure.body(), status=failure.status, headers=failure.headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        await weather_the_call(request.app[PROVIDER].weather, request.path)
        return await handler(request)
    except ApiFailure as failure:
        return _failure(failure)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "not_found" if exc.status == 404 else "invalid_request"
        return _failure(ApiFailure(exc.status, code, exc.reason))


def create_app(provider: FakeProvider) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    app[PROVIDER] = provider
    app.router.add_post("/v1/renders", create_render)
    app.router.add_get("/v1/renders", list_renders)
    app.router.add_get("/v1/renders/{render_id}", get_render)
    app.router.add_post("/v1/renders/{render_id}/cancel", cancel_render)
    app.router.add_get("/outputs/{render_id}.mp4", get_output)
    app.router.add_get("/v1/_counters", get_counters)
    app.router.add_get("/v1/_weather", get_weather)
    app.router.add_put("/v1/_weather", put_weather)
    app.router.add_get("/healthz", healthz)
    app.cleanup_ctx.append(_background)
    return app


async def _background(app: web.Application) -> AsyncIterator[None]:
    """The provider's HTTP client and every render and delivery task live exactly as long as the app."""
    provider = app[PROVIDER]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        provider.session = session
        yield
        await provider.close()
