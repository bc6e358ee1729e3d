"""A stand-in for Veo's two Google APIs on loopback, replaying the recorded payloads in tests/payloads/veo.

Vertex AI (express mode), as google-genai calls it: `POST /v1beta1/publishers/google/models/{model}:
predictLongRunning`, then `POST /v1beta1/projects/{p}/locations/{l}/publishers/google/models/{model}:
fetchPredictOperation` with `{"operationName"}`. A finished video is written where the submit's `storageUri`
says (`gs://bucket/prefix/{operation id}/sample_0.mp4`, as Vertex AI names it) and served as a real MP4 at
`/storage/{bucket}/{object}`, Cloud Storage's HTTPS form (point the adapter's storage URL at `{url}/storage`),
which takes no key; a submit without `storageUri` gets its video back inline. No key: 401 UNAUTHENTICATED; a
wrong one: 400 API_KEY_INVALID.

The Gemini API: `POST /v1beta/models/{model}:predictLongRunning`, `GET /v1/models/{model}/operations/{id}`, and
each finished video at `/v1beta/files/{id}:download?alt=media`, which, like the real file download, wants the
key. No key: 403 PERMISSION_DENIED; a wrong one: 400 API_KEY_INVALID.

`serve_image` puts an input image on the stand-in for image-to-video requests.

A `scenario:<name>` word in the prompt picks what happens. Most scenarios are a script: the recorded operation
states (`{api}_{state}.json`) walked through one per status poll, the last repeated. The rest misbehave at the
door:
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
VERTEX_PLACE = "projects/vidjobs-test/locations/us-central1"  # where express mode puts our operations

# Each scenario's recorded states, without the API's prefix (`scripts(api)` adds it).
_SCRIPTS: dict[str, list[str]] = {
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


def scripts(api: str) -> dict[str, list[str]]:
    """The scenarios' scripts of one API, as payload names."""
    return {scenario: [f"{api}_{state}" for state in states] for scenario, states in _SCRIPTS.items()}


payload = payloads("veo")


@dataclass
class Operation:
    api: str
    id: str
    model: str
    scenario: str
    body: dict[str, Any]
    polls: int = 0

    @property
    def name(self) -> str:
        if self.api == "vertex":
            return f"{VERTEX_PLACE}/publishers/google/models/{self.model}/operations/{self.id}"
        return f"models/{self.model}/operations/{self.id}"


@dataclass
class VeoStandin(PolledStandin):
    door: ClassVar = {"unavailable": (503, "error_unavailable", None),
                      "invalid": (400, "error_invalid_argument", None), "rate_limit": (429, "error_rate_limit", None)}
    operations: dict[str, Operation] = field(default_factory=dict)
    keyless_downloads: int = 0  # Gemini API file downloads refused for want of the key
    keyed_storage_reads: int = 0  # Cloud Storage reads that carried a key (none should: it is Vertex AI's)
    images: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    def submitted(self, prompt: str) -> list[dict[str, Any]]:
        return [body for body in self.submissions if body["instances"][0].get("prompt") == prompt]

    def serve_image(self, name: str, data: bytes, content_type: str) -> str:
        self.images[name] = (data, content_type)
        return f"{self.url}/images/{name}"

    @property
    def storage_url(self) -> str:
        return f"{self.url}/storage"


scenario_of = functools.partial(scenario_in, word="scenario")


ROUTES = web.RouteTableDef()
STANDIN = web.AppKey("standin", VeoStandin)


def _key_refusal(request: web.Request, api: str) -> web.Response | None:
    given = request.headers.get(KEY_HEADER)
    if given is None:
        return answer(*((401, payload("vertex_error_unauthenticated")) if api == "vertex"
                        else (403, payload("gemini_error_permission_denied"))))
    if given != request.app[STANDIN].api_key:
        return answer(400, payload(f"{api}_error_api_key_invalid"))
    return None


async def google_checks(request: web.Request, handler: Any) -> web.StreamResponse:
    """Each API's door: every call wants the API key (Gemini API file downloads too); Cloud Storage wants none."""
    api = "vertex" if request.path.startswith("/v1beta1/") else "gemini" if request.path.startswith("/v1") else None
    if api is not None and (refusal := _key_refusal(request, api)) is not None:
        if request.path.startswith("/v1beta/files/"):
            request.app[STANDIN].keyless_downloads += 1
        return refusal
    return await handler(request)


async def _start(request: web.Request, api: str) -> web.Response:
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
    op = Operation(api=api, id=secrets.token_hex(6), model=model, scenario=scenario, body=body)
    standin.operations[op.id] = op
    standin.submissions.append(body)
    return answer(200, {**payload(f"{api}_operation_started"), "name": op.name})


@ROUTES.post("/v1beta1/publishers/google/models/{call}")
async def vertex_start(request: web.Request) -> web.Response:
    return await _start(request, "vertex")


@ROUTES.post("/v1beta/models/{call}")
async def gemini_start(request: web.Request) -> web.Response:
    return await _start(request, "gemini")


@ROUTES.post("/v1beta1/projects/{project}/locations/{location}/publishers/google/models/{call}")
async def vertex_fetch(request: web.Request) -> web.Response:
    model, _, method = request.match_info["call"].partition(":")
    name = str((await request.json()).get("operationName", ""))
    op = request.app[STANDIN].operations.get(name.rpartition("/")[2])
    if method != "fetchPredictOperation" or op is None or op.name != name or op.model != model:
        return answer(404, payload("error_not_found"))
    return await _state(request, op)


@ROUTES.get("/v1/models/{model}/operations/{op_id}")
async def gemini_get(request: web.Request) -> web.Response:
    op = request.app[STANDIN].operations.get(request.match_info["op_id"])
    if op is None or op.api != "gemini" or op.model != request.match_info["model"]:
        return answer(404, payload("error_not_found"))
    return await _state(request, op)


async def _state(request: web.Request, op: Operation) -> web.Response:
    standin = request.app[STANDIN]
    if op.scenario == "lost":
        return answer(404, payload("error_not_found"))
    if (misbehaved := await standin.misbehaving(op.scenario)) is not None:
        return misbehaved
    state = payload(step(scripts(op.api), op.scenario, op.polls))
    op.polls += 1
    state["name"] = op.name
    response = state.get("response")
    if op.api == "vertex" and isinstance(response, dict):
        storage = op.body.get("parameters", {}).get("storageUri")
        for i, video in enumerate(response.get("videos", [])):
            # Where Vertex AI writes it when told; inline (bytesBase64Encoded) when not.
            video.pop("gcsUri", None)
            if storage:
                video["gcsUri"] = f"{storage.rstrip('/')}/{op.id}/sample_{i}.mp4"
            else:
                video["bytesBase64Encoded"] = "AAAAIGZ0eXBpc29t"
    elif isinstance(response, dict):
        for sample in response.get("generateVideoResponse", {}).get("generatedSamples", []):
            sample["video"]["uri"] = f"{standin.url}/v1beta/files/{op.id}:download?alt=media"
    return answer(200, state)


@ROUTES.get("/v1beta/files/{call}")
async def gemini_download(request: web.Request) -> web.Response:
    op_id, _, method = request.match_info["call"].partition(":")
    op = request.app[STANDIN].operations.get(op_id)
    if op is None or method != "download" or request.query.get("alt") != "media":
        return answer(404, payload("error_not_found"))
    return await _video(request, op)


@ROUTES.get("/storage/{bucket}/{object:.+}")
async def storage_read(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    if KEY_HEADER in request.headers:
        standin.keyed_storage_reads += 1
    parts = request.match_info["object"].split("/")  # .../{operation id}/sample_0.mp4
    op = standin.operations.get(parts[-2] if len(parts) > 1 else "")
    where = f"gs://{request.match_info['bucket']}/{request.match_info['object']}"
    if op is None or not where.startswith(str(op.body.get("parameters", {}).get("storageUri", "-"))):
        return web.Response(status=404, text="No such object.")
    return await _video(request, op)


async def _video(request: web.Request, op: Operation) -> web.Response:
    request.app[STANDIN].downloads += 1
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
    """A Veo stand-in on a free loopback port until the block exits; its `url` is the base URL of both APIs."""
    standin = VeoStandin(api_key=api_key, **options)
    return listening(standin, standin_app(STANDIN, standin, ROUTES, google_checks))
