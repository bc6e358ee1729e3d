"""A stand-in for the Gemini API's Veo routes on loopback, replaying the recorded payloads in tests/payloads/veo.

It speaks the routes the adapter uses (`POST /v1beta/models/{model}:predictLongRunning`,
`GET /v1beta/models/{model}/operations/{id}`), checks the `x-goog-api-key` header like the Gemini API (no key:
403 PERMISSION_DENIED; a wrong one: 400 API_KEY_INVALID), and serves each finished video as a real MP4 at
`/v1beta/files/{id}:download?alt=media`, which, like the real file download, answers 403 without the key.
`serve_image` puts an input image on the stand-in for image-to-video requests.

A `scenario:<name>` word in the prompt picks what happens. Most scenarios are a script: the recorded operation
states walked through one per status poll, the last repeated. The rest misbehave at the door:
| scenario | behaviour |
|---|---|
| `succeed` (default) | running (no `done`), running (`done: false`), done with a video |
| `rai` | running, then done with the video held back by the safety filters |
| `invalid_argument`, `resource_exhausted`, `internal`, `deadline`, `cancelled` | done with that `error` |
| `empty` | done with neither video nor filter reasons |
| `hang` | running for ever |
| `malformed` | an operation body that breaks the API's schema |
| `rate_limit` | 429 RESOURCE_EXHAUSTED (RetryInfo, no Retry-After) to the first `refusals` submits, then `succeed` |
| `unavailable` | 503 to every submit |
| `invalid` | 400 INVALID_ARGUMENT to every submit |
| `garbled` | status answers that are not JSON |
| `slow` | status answers after `slow_s` seconds |
| `lost` | status answers 404 NOT_FOUND |
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.standins.server import serving
from vidjobs.providers.fake.render import ClipSpec, clip_size, render_mp4

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "veo"
KEY_HEADER = "x-goog-api-key"
SCENARIO = re.compile(r"scenario:([a-z_]+)")

SCRIPTS: dict[str, list[str]] = {
    "succeed": ["operation_running", "operation_running_explicit", "operation_succeeded"],
    "rai": ["operation_running", "operation_rai_filtered"],
    "invalid_argument": ["operation_error_invalid_argument"],
    "resource_exhausted": ["operation_running", "operation_error_resource_exhausted"],
    "internal": ["operation_error_internal"],
    "deadline": ["operation_error_deadline"],
    "cancelled": ["operation_cancelled"],
    "empty": ["operation_empty"],
    "hang": ["operation_running"],
    "malformed": ["operation_malformed"],
}


def payload(name: str) -> dict[str, Any]:
    """One recorded payload, freshly parsed."""
    return json.loads((PAYLOADS / f"{name}.json").read_text())


@dataclass
class Operation:
    id: str
    model: str
    scenario: str
    body: dict[str, Any]
    polls: int = 0

    @property
    def name(self) -> str:
        return f"models/{self.model}/operations/{self.id}"


@dataclass
class VeoStandin:
    api_key: str
    refusals: int = 2  # rate_limit: 429s before a prompt is accepted
    slow_s: float = 5.0
    url: str = ""
    operations: dict[str, Operation] = field(default_factory=dict)
    submissions: list[dict[str, Any]] = field(default_factory=list)  # every accepted body, in order
    refused: Counter[str] = field(default_factory=Counter)  # 429s answered, per prompt
    downloads: int = 0  # videos served to a caller with the key
    keyless_downloads: int = 0  # download attempts refused for want of the key
    images: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    def submitted(self, prompt: str) -> list[dict[str, Any]]:
        return [body for body in self.submissions if body["instances"][0].get("prompt") == prompt]

    def serve_image(self, name: str, data: bytes, content_type: str) -> str:
        self.images[name] = (data, content_type)
        return f"{self.url}/images/{name}"


def scenario_of(prompt: str) -> str:
    found = SCENARIO.search(prompt)
    return found.group(1) if found else "succeed"


STANDIN = web.AppKey("standin", VeoStandin)


def _answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def _key_refusal(request: web.Request) -> web.Response | None:
    given = request.headers.get(KEY_HEADER)
    if given is None:
        return _answer(403, payload("error_permission_denied"))
    if given != request.app[STANDIN].api_key:
        return _answer(400, payload("error_api_key_invalid"))
    return None


@web.middleware
async def gemini_checks(request: web.Request, handler: Any) -> web.StreamResponse:
    """The Gemini API's door: every /v1beta route wants the API key (file downloads too)."""
    if request.path.startswith("/v1beta/"):
        if (refusal := _key_refusal(request)) is not None:
            if request.path.startswith("/v1beta/files/"):
                request.app[STANDIN].keyless_downloads += 1
            return refusal
    return await handler(request)


async def predict_long_running(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    model, _, method = request.match_info["call"].partition(":")
    if method != "predictLongRunning":
        raise web.HTTPNotFound()
    body = await request.json()
    prompt = str(body["instances"][0].get("prompt", ""))
    scenario = scenario_of(prompt)
    if scenario == "unavailable":
        return _answer(503, payload("error_unavailable"))
    if scenario == "invalid":
        return _answer(400, payload("error_invalid_argument"))
    if scenario == "rate_limit" and standin.refused[prompt] < standin.refusals:
        standin.refused[prompt] += 1
        return _answer(429, payload("error_rate_limit"))
    op = Operation(id=secrets.token_hex(6), model=model, scenario=scenario, body=body)
    standin.operations[op.id] = op
    standin.submissions.append(body)
    return _answer(200, {**payload("operation_started"), "name": op.name})


async def get_operation(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    op = standin.operations.get(request.match_info["op_id"])
    if op is None or op.model != request.match_info["model"] or op.scenario == "lost":
        return _answer(404, payload("error_not_found"))
    if op.scenario == "garbled":
        return web.Response(status=200, text="<html><body>upstream hiccup</body></html>", content_type="text/html")
    if op.scenario == "slow":
        await asyncio.sleep(standin.slow_s)
    script = SCRIPTS.get(op.scenario, SCRIPTS["succeed"])
    state = payload(script[min(op.polls, len(script) - 1)])
    op.polls += 1
    state["name"] = op.name
    answer = state.get("response")
    videos = answer.get("generateVideoResponse", {}) if isinstance(answer, dict) else {}
    for sample in videos.get("generatedSamples", []):
        sample["video"]["uri"] = f"{standin.url}/v1beta/files/{op.id}:download?alt=media"
    return _answer(200, state)


async def download_file(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    op_id, _, method = request.match_info["call"].partition(":")
    op = standin.operations.get(op_id)
    if op is None or method != "download" or request.query.get("alt") != "media":
        return _answer(404, payload("error_not_found"))
    standin.downloads += 1
    return web.Response(body=await render_mp4(_clip(op.body)), content_type="video/mp4")


async def get_image(request: web.Request) -> web.Response:
    found = request.app[STANDIN].images.get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    return web.Response(body=found[0], content_type=found[1])


def _clip(body: dict[str, Any]) -> ClipSpec:
    parameters = body.get("parameters", {})
    aspect = parameters.get("aspectRatio", "16:9")
    return ClipSpec(*clip_size(aspect), duration_s=float(parameters.get("durationSeconds", 8)), seed=11)


def create_app(standin: VeoStandin) -> web.Application:
    app = web.Application(middlewares=[gemini_checks])
    app[STANDIN] = standin
    app.router.add_post("/v1beta/models/{call}", predict_long_running)
    app.router.add_get("/v1beta/models/{model}/operations/{op_id}", get_operation)
    app.router.add_get("/v1beta/files/{call}", download_file)
    app.router.add_get("/images/{name}", get_image)
    return app


@contextlib.asynccontextmanager
async def running_veo(api_key: str, **options: Any) -> AsyncIterator[VeoStandin]:
    """A Veo stand-in on a free loopback port until the block exits; its `url` is the base URL."""
    standin = VeoStandin(api_key=api_key, **options)
    async with serving(create_app(standin)) as standin.url:
        yield standin
