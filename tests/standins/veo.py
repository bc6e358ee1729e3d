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

import contextlib
import functools
import secrets
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from tests.standins.server import PAYLOADS as ALL_PAYLOADS
from tests.standins.server import PolledStandin, answer, listening, payloads, scenario_in, standin_app, step
from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4

PAYLOADS = ALL_PAYLOADS / "veo"
KEY_HEADER = "x-goog-api-key"

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


payload = payloads("veo")


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
class VeoStandin(PolledStandin):
    door: ClassVar = {"unavailable": (503, "error_unavailable", None),
                      "invalid": (400, "error_invalid_argument", None), "rate_limit": (429, "error_rate_limit", None)}
    operations: dict[str, Operation] = field(default_factory=dict)
    keyless_downloads: int = 0  # download attempts refused for want of the key
    images: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    def submitted(self, prompt: str) -> list[dict[str, Any]]:
        return [body for body in self.submissions if body["instances"][0].get("prompt") == prompt]

    def serve_image(self, name: str, data: bytes, content_type: str) -> str:
        self.images[name] = (data, content_type)
        return f"{self.url}/images/{name}"


scenario_of = functools.partial(scenario_in, word="scenario")


ROUTES = web.RouteTableDef()
STANDIN = web.AppKey("standin", VeoStandin)


def _key_refusal(request: web.Request) -> web.Response | None:
    given = request.headers.get(KEY_HEADER)
    if given is None:
        return answer(403, payload("error_permission_denied"))
    if given != request.app[STANDIN].api_key:
        return answer(400, payload("error_api_key_invalid"))
    return None


async def gemini_checks(request: web.Request, handler: Any) -> web.StreamResponse:
    """The Gemini API's door: every /v1beta route wants the API key (file downloads too)."""
    if request.path.startswith("/v1beta/"):
        if (refusal := _key_refusal(request)) is not None:
            if request.path.startswith("/v1beta/files/"):
                request.app[STANDIN].keyless_downloads += 1
            return refusal
    return await handler(request)


@ROUTES.post("/v1beta/models/{call}")
async def predict_long_running(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    model, _, method = request.match_info["call"].partition(":")
    if method != "predictLongRunning":
        raise web.HTTPNotFound()
    body = await request.json()
    prompt = str(body["instances"][0].get("prompt", ""))
    scenario = scenario_of(prompt)
    if refused := standin.at_the_door(scenario, prompt):
        status, name, headers = refused
        return answer(status, payload(name), headers)
    op = Operation(id=secrets.token_hex(6), model=model, scenario=scenario, body=body)
    standin.operations[op.id] = op
    standin.submissions.append(body)
    return answer(200, {**payload("operation_started"), "name": op.name})


@ROUTES.get("/v1beta/models/{model}/operations/{op_id}")
async def get_operation(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    op = standin.operations.get(request.match_info["op_id"])
    if op is None or op.model != request.match_info["model"] or op.scenario == "lost":
        return answer(404, payload("error_not_found"))
    if (misbehaved := await standin.misbehaving(op.scenario)) is not None:
        return misbehaved
    state = payload(step(SCRIPTS, op.scenario, op.polls))
    op.polls += 1
    state["name"] = op.name
    response = state.get("response")
    videos = response.get("generateVideoResponse", {}) if isinstance(response, dict) else {}
    for sample in videos.get("generatedSamples", []):
        sample["video"]["uri"] = f"{standin.url}/v1beta/files/{op.id}:download?alt=media"
    return answer(200, state)


@ROUTES.get("/v1beta/files/{call}")
async def download_file(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    op_id, _, method = request.match_info["call"].partition(":")
    op = standin.operations.get(op_id)
    if op is None or method != "download" or request.query.get("alt") != "media":
        return answer(404, payload("error_not_found"))
    standin.downloads += 1
    return web.Response(body=await render_mp4(_clip(op.body)), content_type="video/mp4")


@ROUTES.get("/images/{name}")
async def get_image(request: web.Request) -> web.Response:
    found = request.app[STANDIN].images.get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    return web.Response(body=found[0], content_type=found[1])


def _clip(body: dict[str, Any]) -> ClipSpec:
    parameters = body.get("parameters", {})
    aspect = parameters.get("aspectRatio", "16:9")
    return ClipSpec(*clip_size(aspect), duration_s=float(parameters.get("durationSeconds", 8)), seed=11)




def running_veo(api_key: str, **options: Any) -> contextlib.AbstractAsyncContextManager[VeoStandin]:
    """A Veo stand-in on a free loopback port until the block exits; its `url` is the base URL."""
    standin = VeoStandin(api_key=api_key, **options)
    return listening(standin, standin_app(STANDIN, standin, ROUTES, gemini_checks))
