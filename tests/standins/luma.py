"""A stand-in for Luma's Dream Machine API on loopback, replaying the recorded payloads in `tests/payloads/luma`
with ids, requests, URLs and timestamps rewritten for each generation.

Routes, as Luma has them (JSON; errors are `{"detail": ...}`):
  POST   /dream-machine/v1/generations/video   create a video generation (201)
  GET    /dream-machine/v1/generations         the account's generations, newest first (`limit`, `offset`)
  GET    /dream-machine/v1/generations/{id}    one generation
  DELETE /dream-machine/v1/generations/{id}    delete it (204); a generation in progress stops
  GET    /files/{id}/video.mp4                 the render, a real MP4 (as Luma's CDN serves it)
  POST   /_sink                                keeps whatever is POSTed: a callback receiver for unit tests

Every /dream-machine call needs `Authorization: Bearer <api_key>`. The generation is POSTed, unsigned, to its
`callback_url` when it starts dreaming, completes or fails; a delivery not answered 200 is retried 3 times
100 ms apart, as Luma documents.

A `standin:<scenario>` word in the prompt picks the behaviour:
  succeed (default)  queued, dreaming, completed; the video in `assets.video`
  moderation         fails with failure_reason "Advanced moderation failed"
  fail               fails with an internal error
  refused            create answered 400: prompt not allowed by moderation
  invalid            create answered 400: invalid request
  schema             create answered 422 with a list of field errors
  rate_limit         create answered 429 with `Retry-After: 2`
  unavailable        create answered 500
  malformed          create answered 201 with a truncated body
  no_callback        renders but calls nobody back
  hang               stays dreaming
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.standins import server
from tests.standins.server import CallingStandin, Render, bearer_door, listening, payloads, scenario_in
from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4

RETRY_AFTER_S = 2
CALLBACK_RETRIES, CALLBACK_RETRY_DELAY_S = 3, 0.1


class Scenario(enum.StrEnum):
    SUCCEED = "succeed"
    MODERATION = "moderation"
    FAIL = "fail"
    REFUSED = "refused"
    INVALID = "invalid"
    SCHEMA = "schema"
    RATE_LIMIT = "rate_limit"
    UNAVAILABLE = "unavailable"
    MALFORMED = "malformed"
    NO_CALLBACK = "no_callback"
    HANG = "hang"


# What a scenario answers to a create instead of accepting it: (recorded payload, status).
_REFUSALS = {
    Scenario.REFUSED: ("error_400_moderation", 400), Scenario.INVALID: ("error_400_invalid", 400),
    Scenario.SCHEMA: ("error_422_schema", 422), Scenario.RATE_LIMIT: ("error_429_rate_limited", 429),
    Scenario.UNAVAILABLE: ("error_500_internal", 500),
}
_FAILED = {Scenario.MODERATION: "generation_failed_moderation", Scenario.FAIL: "generation_failed"}


payload = payloads("luma")  # as Luma's documentation shows them


@dataclass(kw_only=True)
class Generation(Render):
    request: dict[str, Any]
    state: str = "queued"

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed")


class LumaStandin(CallingStandin):
    session_timeout_s = 5.0  # Luma gives up on a slow callback receiver sooner

    def __init__(self, *, api_key: str, step_s: float = 0.2):
        super().__init__()
        self.api_key = api_key
        self.step_s = step_s  # each state lasts this long
        self.generations: dict[str, Generation] = {}  # in creation order
        self.creates: list[dict[str, Any]] = []  # every create body, as sent
        self.deleted: list[str] = []

    def view(self, gen: Generation) -> dict[str, Any]:
        """The generation as Luma shows it: the recorded payload for its state, rewritten for it."""
        name = {"queued": "generation_queued", "dreaming": "generation_dreaming",
                "completed": "generation_completed"}.get(gen.state) or _FAILED[gen.scenario]
        body = payload(name)
        body.update(id=gen.id, created_at=gen.created_at, model=gen.request.get("model"),
                    request={**body["request"], "keyframes": None, **gen.request})
        if gen.state == "completed":
            body["assets"] = {**body["assets"], "video": f"{self.url}/files/{gen.id}/video.mp4",
                              "image": f"{self.url}/files/{gen.id}/thumb.jpg"}
        return body

    def create(self, request: dict[str, Any]) -> Generation:
        width, height = clip_size(request.get("aspect_ratio", "16:9"))
        seconds = float(str(request.get("duration", "5s")).rstrip("s"))
        scenario = Scenario(scenario_in(str(request.get("prompt", ""))))
        gen = Generation(id=str(uuid.uuid4()), request=request, scenario=scenario,
                         clip=ClipSpec(width, height, seconds, secrets.randbelow(2**31)))
        self.generations[gen.id] = gen
        gen.task = self.spawn(self._run(gen), f"generation-{gen.id}")
        return gen

    async def _run(self, gen: Generation) -> None:
        await asyncio.sleep(self.step_s)
        self._move(gen, "dreaming")
        if not await self.worked(gen, self.step_s):
            return
        if gen.scenario in _FAILED:
            self._move(gen, "failed")
            return
        await render_mp4(gen.clip)  # ready before completion is reported, so the video serves at once
        self._move(gen, "completed")

    def _move(self, gen: Generation, state: str) -> None:
        gen.state = state
        url = gen.request.get("callback_url")
        if url and gen.scenario is not Scenario.NO_CALLBACK:
            body = json.dumps(self.view(gen)).encode()
            # Unsigned; anything but a 200 is retried at a fixed pace, as Luma documents.
            delivery = self.deliver(url, body, attempts=1 + CALLBACK_RETRIES, headers=dict,
                                    taken=lambda outcome: outcome == 200, pause=lambda _: CALLBACK_RETRY_DELAY_S)
            self.spawn(delivery, f"callback-{gen.id}-{state}")

    def delete(self, gen: Generation) -> None:
        if gen.task is not None:
            gen.task.cancel()
        del self.generations[gen.id]
        self.deleted.append(gen.id)


# --- HTTP ----------------------------------------------------------------------------------------------

ROUTES = web.RouteTableDef()
STANDIN = web.AppKey("standin", LumaStandin)


def _error(name: str, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(payload(name), status=status, headers=headers)


@ROUTES.post("/dream-machine/v1/generations/video")
async def create_generation(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    body = await server.json_body(request, {"detail": "Invalid JSON body"})
    standin.creates.append(body)
    scenario = Scenario(scenario_in(str(body.get("prompt", ""))))
    if scenario in _REFUSALS:
        name, status = _REFUSALS[scenario]
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None
        return _error(name, status, headers)
    if scenario is Scenario.MALFORMED:
        return server.truncated(payload("generation_queued"), 201)
    return web.json_response(standin.view(standin.create(body)), status=201)


@ROUTES.get("/dream-machine/v1/generations")
async def list_generations(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    limit, offset = int(request.query.get("limit", "100")), int(request.query.get("offset", "0"))
    newest_first = list(reversed(standin.generations.values()))
    page = newest_first[offset: offset + limit]
    body = {**payload("generation_list"), "generations": [standin.view(g) for g in page], "count": len(page),
            "limit": limit, "offset": offset, "has_more": offset + limit < len(newest_first)}
    return web.json_response(body)


_generation = server.render_routes(ROUTES, STANDIN, "/dream-machine/v1/generations", "/files/{id}/video.mp4",
                                   lambda standin: standin.generations, lambda gen: gen.state == "completed",
                                   missing=lambda: payload("error_404_not_found"))


@ROUTES.delete("/dream-machine/v1/generations/{id}")
async def delete_generation(request: web.Request) -> web.Response:
    request.app[STANDIN].delete(_generation(request))
    return web.Response(status=204)


require_key = bearer_door("/dream-machine/", lambda request: request.app[STANDIN].api_key,
                          lambda: _error("error_401_invalid_key", 401))


def running_luma_standin(*, api_key: str, host: str = "127.0.0.1",
                         **options: Any) -> contextlib.AbstractAsyncContextManager[LumaStandin]:
    """A Luma stand-in listening on a free port of `host` until the block exits."""
    standin = LumaStandin(api_key=api_key, **options)
    return listening(standin, server.standin_app(STANDIN, standin, ROUTES, require_key), host)
