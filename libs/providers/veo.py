"""The adapter for Google's Veo through the Gemini API (https://ai.google.dev/gemini-api/docs/video): polling only.

A render is a long-running operation: `POST /v1beta/models/{model}:predictLongRunning` starts one and answers
its name (`models/{model}/operations/{id}`, our provider job id), and `GET /v1beta/{name}` says where it
stands: not `done` yet, `done` with an `error` (a google.rpc.Status), or `done` with
`response.generateVideoResponse` holding `generatedSamples[].video.uri` or, when the safety filters held the
video back, `raiMediaFilteredCount` and `raiMediaFilteredReasons`. Veo sends no callbacks and reports no
progress figure, so a running operation is shown as rendering without a percentage.

The video URI is a Gemini API file download that needs our API key, so `download_headers` carries it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from vidjobs.common.errors import DEFAULT_MESSAGES, ErrorCode, JobError, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import (
    Format,
    ModelInfo,
    ProviderSignal,
    ProviderState,
    Submission,
    SubmitRequest,
)
from vidjobs.providers.checks import check_frame, invalid, listed, pick_model
from vidjobs.providers.http import ErrorTable, HttpAdapter, Refusal, Said, decode, lost, rows

KEY_SETTING = "VIDJOBS_VEO_API_KEY"
KEY_HEADER = "x-goog-api-key"
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # Veo's documented limit for an image-to-video input
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")
# An operation name as the API hands it out; anything else never reaches a request path.
OPERATION_NAME = re.compile(r"^models/[A-Za-z0-9._-]+/operations/[A-Za-z0-9._-]+$")

_V2_FRAMES = {("16:9", "720p"): "16:9", ("9:16", "720p"): "9:16"}
_V3_FRAMES = {**_V2_FRAMES, ("16:9", "1080p"): "16:9"}
_V31_FRAMES = {**_V3_FRAMES, ("9:16", "1080p"): "9:16"}

# personGeneration values each generation allows, for text-to-video and for image-to-video.
_V2_PEOPLE = (("allow_all", "allow_adult", "dont_allow"), ("allow_adult", "dont_allow"))
_V3_PEOPLE = (("allow_all",), ("allow_adult",))


@dataclass(frozen=True)
class Model:
    """What one Veo model accepts through the Gemini API, from its parameter table."""

    name: str
    durations: tuple[int, ...]
    frames: Mapping[tuple[str, str], str]  # our (aspect ratio, resolution) -> Veo's aspectRatio
    people: tuple[tuple[str, ...], tuple[str, ...]]  # personGeneration: text-to-video, image-to-video
    sends_resolution: bool = True  # Veo 2 renders 720p only and takes no `resolution`

    def people_for(self, has_image: bool) -> tuple[str, ...]:
        return self.people[1] if has_image else self.people[0]


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("veo-2.0-generate-001", (5, 6, 7, 8), _V2_FRAMES, _V2_PEOPLE, sends_resolution=False),
    Model("veo-3.0-generate-preview", (4, 6, 8), _V3_FRAMES, _V3_PEOPLE),
    Model("veo-3.0-generate-001", (4, 6, 8), _V3_FRAMES, _V3_PEOPLE),
    Model("veo-3.0-fast-generate-001", (4, 6, 8), _V3_FRAMES, _V3_PEOPLE),
    Model("veo-3.1-generate-preview", (4, 6, 8), _V31_FRAMES, _V3_PEOPLE),
    Model("veo-3.1-fast-generate-preview", (4, 6, 8), _V31_FRAMES, _V3_PEOPLE),
)}
PARAMS = ("person_generation",)
FULL_HD_DURATION_S = 8  # Veo 3 renders 1080p as 8 s clips only

# google.rpc.Code numbers, as an operation's `error.code` carries them.
_GRPC_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 11: "OUT_OF_RANGE",
    13: "INTERNAL", 14: "UNAVAILABLE", 16: "UNAUTHENTICATED",
}
_STATUS_CODES: dict[str, ErrorCode] = {
    "INVALID_ARGUMENT": ErrorCode.INVALID_INPUT,
    "FAILED_PRECONDITION": ErrorCode.INVALID_INPUT,
    "OUT_OF_RANGE": ErrorCode.INVALID_INPUT,
    # Our project's quota ran out mid-render: nothing wrong with the job, and it may pass later.
    "RESOURCE_EXHAUSTED": ErrorCode.PROVIDER_UNAVAILABLE,
    "DEADLINE_EXCEEDED": ErrorCode.TIMEOUT,
    "PERMISSION_DENIED": ErrorCode.INTERNAL,
    "UNAUTHENTICATED": ErrorCode.INTERNAL,
}


# --- the Gemini API's wire format, as far as we read it -------------------------------------------------


class _Status(msgspec.Struct, kw_only=True):
    """google.rpc.Status: an operation's `error`, and the `error` of an HTTP error answer (with `status`)."""

    code: int = 0
    message: str = ""
    status: str | None = None
    details: list[dict[str, Any]] = []


class _ErrorAnswer(msgspec.Struct):
    error: _Status


class _Video(msgspec.Struct):
    uri: str | None = None


class _Sample(msgspec.Struct):
    video: _Video | None = None


class _VideoResponse(msgspec.Struct, kw_only=True, rename="camel"):
    generated_samples: list[_Sample] = []
    rai_media_filtered_count: int = 0
    rai_media_filtered_reasons: list[str] = []


class _OperationResponse(msgspec.Struct, rename="camel"):
    generate_video_response: _VideoResponse | None = None


class _Operation(msgspec.Struct, kw_only=True):
    name: str
    done: bool = False
    error: _Status | None = None
    response: _OperationResponse | None = None


# --- the adapter ---------------------------------------------------------------------------------------


def _said(status: int, body: bytes) -> Said:
    given = _error_answer(body)
    # The Gemini API answers a wrong key with 400 INVALID_ARGUMENT; the reason tells it from a bad request.
    wrong_key = _reason(given) in ("API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED")
    return Said(given.message if given is not None else "", _KEY_REFUSED if wrong_key else None,
                _retry_delay(given))


_KEY_REFUSED = Refusal(ErrorCode.INTERNAL, "{title} refused our API key ({status}): check " + KEY_SETTING)
ERRORS = ErrorTable("Veo", {
    **rows((401, 403), _KEY_REFUSED),
    **rows((400, 413, 415, 422), Refusal(ErrorCode.INVALID_INPUT, "{title} cannot render this request: {said}")),
}, _said)
http_error = ERRORS.error


class VeoAdapter(HttpAdapter):
    name = "veo"
    errors = ERRORS
    echo_transport = False

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str):
        super().__init__(session, base_url)
        self._api_key = api_key

    def auth_headers(self) -> dict[str, str]:
        return {KEY_HEADER: self._api_key}

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"veo/{m.name}", durations_s=list(m.durations),
                          formats=[Format(ratio, res, [FULL_HD_DURATION_S] if res == "1080p" else None)
                                   for ratio, res in m.frames], input_image="optional",
                          negative_prompt=True)
                for m in MODELS.values()]

    def validate(self, request: JobRequest) -> None:
        model = pick_model(self.name, "Veo", request.model_name, MODELS)
        check_frame(f"veo/{model.name}", model.frames, request)
        if request.duration_s not in model.durations:
            raise invalid(f"duration_s: veo/{model.name} renders clips of {listed(model.durations)} seconds, "
                          f"not {request.duration_s}")
        if request.resolution == "1080p" and request.duration_s != FULL_HD_DURATION_S:
            raise invalid(f"duration_s: veo/{model.name} renders 1080p as {FULL_HD_DURATION_S} s clips only")
        if request.seed is not None:
            raise invalid(f"seed: veo/{model.name} takes no seed through the Gemini API; leave it null")
        _check_params(model, request.params, has_image=request.input_image is not None)

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        image = await self._inline_image(req) if req.request.input_image is not None else None
        path = f"/v1beta/models/{quote(req.request.model_name, safe='')}:predictLongRunning"
        started = decode(await self.call("POST", path, json=operation_body(req, image)), _Operation, "Veo")
        if not OPERATION_NAME.match(started.name):
            raise ProviderError(ErrorCode.INTERNAL, f"Veo named its operation unexpectedly: {started.name[:100]!r}")
        return Submission(provider_job_id=started.name, state=ProviderState.QUEUED)

    async def status(self, provider_job_id: str) -> ProviderSignal:
        if not OPERATION_NAME.match(provider_job_id):
            raise ProviderError(ErrorCode.INTERNAL, f"not a Veo operation name: {provider_job_id[:100]!r}")
        raw = await self.call_known("GET", f"/v1beta/{quote(provider_job_id, safe='/')}")
        return lost(provider_job_id, "Veo no longer knows this render.") if raw is None else read_operation(raw)

    async def cancel(self, provider_job_id: str) -> None:
        # The Gemini API documents no way to stop a Veo operation. The render runs to its end and its late
        # signals find a finished job, which ignores them.
        return None

    def download_headers(self) -> dict[str, str]:
        return {KEY_HEADER: self._api_key}  # the video URI is a Gemini API file download, keyed like any call

    async def _inline_image(self, req: SubmitRequest) -> dict[str, str]:
        """The input image as the Gemini API takes it: inline, base64-encoded (it fetches no URLs)."""
        if not req.input_image_url:
            raise invalid("input_image: the image has no address to read it from")
        try:
            async with self.session.get(req.input_image_url) as resp:
                mime = resp.content_type
                if resp.status != 200 or mime not in IMAGE_TYPES or (resp.content_length or 0) > MAX_IMAGE_BYTES:
                    raise invalid(f"input_image: cannot be read as a PNG, JPEG or WebP image up to "
                                   f"{MAX_IMAGE_BYTES // 2**20} MB (HTTP {resp.status}, {mime})")
                data = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    data += chunk
                    if len(data) > MAX_IMAGE_BYTES:
                        raise invalid(f"input_image: larger than the {MAX_IMAGE_BYTES // 2**20} MB Veo accepts")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ProviderError(ErrorCode.INTERNAL, f"the input image could not be read: {type(exc).__name__}") \
                from exc
        return {"bytesBase64Encoded": base64.b64encode(data).decode(), "mimeType": mime}


# --- translation ---------------------------------------------------------------------------------------


def operation_body(req: SubmitRequest, image: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON body that starts an operation for this request (validated already)."""
    r = req.request
    model = MODELS[r.model_name]
    instance: dict[str, Any] = {"prompt": r.prompt}
    if image is not None:
        instance["image"] = image
    parameters: dict[str, Any] = {"aspectRatio": model.frames[(r.aspect_ratio, r.resolution)],
                                  "durationSeconds": r.duration_s}
    if model.sends_resolution:
        parameters["resolution"] = r.resolution
    if r.negative_prompt is not None:
        parameters["negativePrompt"] = r.negative_prompt
    if "person_generation" in r.params:
        parameters["personGeneration"] = r.params["person_generation"]
    return {"instances": [instance], "parameters": parameters}


def read_operation(raw: bytes) -> ProviderSignal:
    """A `GET /v1beta/{operation}` answer as a signal; ProviderError(INTERNAL) when it breaks the API's schema."""
    return operation_signal(decode(raw, _Operation, "Veo"))


def operation_signal(op: _Operation) -> ProviderSignal:
    """An operation as the Gemini API reports it, as a signal of ours."""
    if not op.done:
        return ProviderSignal(provider_job_id=op.name, state=ProviderState.RUNNING)  # Veo gives no percentage
    if op.error is not None:
        return _errored(op.name, op.error)
    answer = (op.response and op.response.generate_video_response) or _VideoResponse()
    uri = next((s.video.uri for s in answer.generated_samples if s.video is not None and s.video.uri), None)
    if uri is not None:
        return ProviderSignal(provider_job_id=op.name, state=ProviderState.SUCCEEDED, output_url=uri)
    if answer.rai_media_filtered_count > 0 or answer.rai_media_filtered_reasons:
        said = " ".join(answer.rai_media_filtered_reasons)
        error = _job_error(ErrorCode.CONTENT_REJECTED, f"Veo's safety filters held the video back. {said}".strip())
    else:
        error = _job_error(ErrorCode.PROVIDER_UNAVAILABLE, "Veo finished without a video.")
    return ProviderSignal(provider_job_id=op.name, state=ProviderState.FAILED, error=error)


def _errored(name: str, status: _Status) -> ProviderSignal:
    grpc = status.status or _GRPC_NAMES.get(status.code, "UNKNOWN")
    if grpc == "CANCELLED":
        return ProviderSignal(provider_job_id=name, state=ProviderState.CANCELED)
    code = _STATUS_CODES.get(grpc, ErrorCode.PROVIDER_UNAVAILABLE)
    error = _job_error(code, f"{grpc}: {status.message}" if status.message else grpc)
    return ProviderSignal(provider_job_id=name, state=ProviderState.FAILED, error=error)


def _job_error(code: ErrorCode, said: str) -> JobError:
    return JobError.of(code, f"{DEFAULT_MESSAGES[code]} Veo said: {said}")


def _error_answer(body: bytes) -> _Status | None:
    try:
        return msgspec.json.decode(body, type=_ErrorAnswer).error
    except msgspec.DecodeError:
        return None


def _detail(given: _Status | None, kind: str) -> dict[str, Any]:
    """The first `details` entry of a type (`google.rpc.ErrorInfo`, `google.rpc.RetryInfo`), or {}."""
    for item in given.details if given is not None else ():
        if isinstance(item, dict) and str(item.get("@type", "")).endswith(f"/{kind}"):
            return item
    return {}


def _reason(given: _Status | None) -> str | None:
    return _detail(given, "google.rpc.ErrorInfo").get("reason")


def _retry_delay(given: _Status | None) -> float | None:
    """RetryInfo's `retryDelay` ("33s", a protobuf Duration in JSON) in seconds."""
    delay = _detail(given, "google.rpc.RetryInfo").get("retryDelay")
    if not isinstance(delay, str) or not delay.endswith("s"):
        return None
    try:
        return max(0.0, float(delay[:-1]))
    except ValueError:
        return None


# --- validation ----------------------------------------------------------------------------------------


def _check_params(model: Model, params: Mapping[str, Any], *, has_image: bool) -> None:
    for name in params:
        if name not in PARAMS:
            raise invalid(f"params.{name}: not a parameter of veo/{model.name} (it takes {', '.join(PARAMS)})")
    allowed = model.people_for(has_image)
    if "person_generation" in params and params["person_generation"] not in allowed:
        mode = "from an image" if has_image else "from text"
        raise invalid(f"params.person_generation: veo/{model.name} rendering {mode} takes "
                       f"{' or '.join(repr(v) for v in allowed)}, not {params['person_generation']!r}")
