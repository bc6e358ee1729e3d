"""The adapter for Google's Veo through the Gemini API: long-running operations started and polled, no callbacks,
and a video download keyed like any call. docs/PROVIDERS.md has the routes and fields it reads."""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import quote

import msgspec

from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, http, models
from vidjobs.providers.base import Format, ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest
from vidjobs.providers.checks import invalid
from vidjobs.providers.google_rpc import ErrorAnswer, Status
from vidjobs.providers.http import ErrorTable, HttpAdapter, Said, decode, lost, read_or_none, refusals

KEY_SETTING = "VIDJOBS_VEO_API_KEY"
KEY_HEADER = "x-goog-api-key"
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # Veo's documented limit for an image-to-video input
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")
# An operation name as the API hands it out; anything else never reaches a request path.
OPERATION_NAME = re.compile(r"^models/[A-Za-z0-9._-]+/operations/[A-Za-z0-9._-]+$")


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """What one Veo model accepts: a row of `models/veo.toml`."""

    durations: tuple[int, ...]
    frames: str  # its frame set: our (aspect ratio, resolution) -> Veo's aspectRatio
    people: str  # its personGeneration values, from text and from an image
    sends_resolution: bool = True

    def frame_map(self) -> dict[tuple[str, str], str]:
        return FRAMES[self.frames]

    def people_for(self, has_image: bool) -> tuple[str, ...]:
        return tuple(PEOPLE[self.people]["image" if has_image else "text"])


class _Catalog(msgspec.Struct):
    frames: dict[str, dict[str, str]]
    people: dict[str, dict[str, list[str]]]
    models: dict[str, Model]


_CATALOG = models.load("veo", _Catalog)
FRAMES = models.frame_sets(_CATALOG.frames)
PEOPLE, MODELS = _CATALOG.people, _CATALOG.models
FULL_HD_DURATION_S = 8  # Veo 3 renders 1080p as 8 s clips only

# --- the Gemini API's wire format, as far as we read it -------------------------------------------------


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
    error: Status | None = None
    response: _OperationResponse | None = None


# --- the adapter ---------------------------------------------------------------------------------------


def _said(status: int, body: bytes) -> Said:
    answer = read_or_none(body, ErrorAnswer)
    given = answer.error if answer else Status()
    # The Gemini API answers a wrong key with 400 INVALID_ARGUMENT; the reason tells it from a bad request.
    wrong_key = given.detail("ErrorInfo").get("reason") in ("API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED")
    return Said(given.message, _KEY_REFUSED if wrong_key else None, given.retry_delay())


ERRORS = ErrorTable("Veo", refusals(KEY_SETTING, inputs=(400, 413, 415, 422)), _said)
_KEY_REFUSED = ERRORS.rows[401]
http_error = ERRORS.error


class VeoAdapter(HttpAdapter):
    name = "veo"
    errors = ERRORS
    echo_transport = False
    key_header = (KEY_HEADER, "{}")

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"veo/{name}", durations_s=list(m.durations),
                          formats=[Format(ratio, res, [FULL_HD_DURATION_S] if res == "1080p" else None)
                                   for ratio, res in m.frame_map()], input_image="optional",
                          negative_prompt=True)
                for name, m in MODELS.items()]

    def validate(self, request: JobRequest) -> None:
        model = checks.pick_model(self.name, "Veo", request.model_name, MODELS)
        model_id = f"veo/{request.model_name}"
        checks.check_frame(model_id, model.frame_map(), request)
        checks.check_duration(model_id, model.durations, request)
        if request.resolution == "1080p" and request.duration_s != FULL_HD_DURATION_S:
            raise invalid(f"duration_s: {model_id} renders 1080p as {FULL_HD_DURATION_S} s clips only")
        checks.check_optional(model_id, request, negative_prompt=True)  # the Gemini API takes no seed
        people = model.people_for(has_image=request.input_image is not None)
        checks.check_params(model_id, request.params, {"person_generation": checks.one_of(*people)})

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        image = await self._inline_image(req) if req.request.input_image is not None else None
        path = f"/v1beta/models/{quote(req.request.model_name, safe='')}:predictLongRunning"
        started = decode(await self.call("POST", path, json=operation_body(req, image)), _Operation, "Veo")
        if not OPERATION_NAME.match(started.name):
            raise ProviderError(ErrorCode.INTERNAL, f"Veo named its operation unexpectedly: {started.name[:100]!r}")
        return Submission(provider_job_id=started.name, state=ProviderState.QUEUED)

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        if not OPERATION_NAME.match(provider_job_id):
            raise ProviderError(ErrorCode.INTERNAL, f"not a Veo operation name: {provider_job_id[:100]!r}")
        raw = await self.call_known("GET", f"/v1beta/{quote(provider_job_id, safe='/')}")
        return lost(provider_job_id, "Veo no longer knows this render.") if raw is None else read_operation(raw)

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        # The Gemini API documents no way to stop a Veo operation. The render runs to its end and its late
        # signals find a finished job, which ignores them.
        return None

    def download_headers(self) -> dict[str, str]:
        return dict(self.auth_headers())  # the video URI is a Gemini API file download, keyed like any call

    async def _inline_image(self, req: SubmitRequest) -> dict[str, str]:
        """The input image as the Gemini API takes it: inline, base64-encoded (it fetches no URLs)."""
        data, mime = await http.read_image(self.session, req.input_image_url, IMAGE_TYPES, MAX_IMAGE_BYTES)
        return {"bytesBase64Encoded": base64.b64encode(data).decode(), "mimeType": mime}


# --- translation ---------------------------------------------------------------------------------------


def operation_body(req: SubmitRequest, image: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON body that starts an operation for this request (validated already)."""
    r = req.request
    model = MODELS[r.model_name]
    instance: dict[str, Any] = {"prompt": r.prompt}
    if image is not None:
        instance["image"] = image
    parameters: dict[str, Any] = {"aspectRatio": model.frame_map()[(r.aspect_ratio, r.resolution)],
                                  "durationSeconds": r.duration_s}
    if model.sends_resolution:
        parameters["resolution"] = r.resolution
    if r.negative_prompt:
        parameters["negativePrompt"] = r.negative_prompt
    if "person_generation" in r.params:
        parameters["personGeneration"] = r.params["person_generation"]
    return {"instances": [instance], "parameters": parameters}


def read_operation(raw: bytes) -> ProviderSignal:
    """A `GET /v1beta/{operation}` answer as a signal; ProviderError(INTERNAL) when it breaks the API's schema."""
    op = decode(raw, _Operation, "Veo")
    if not op.done:
        return ProviderSignal(provider_job_id=op.name, state=ProviderState.RUNNING)  # Veo gives no percentage
    if op.error is not None:
        return _errored(op.name, op.error)
    answer = (op.response and op.response.generate_video_response) or _VideoResponse()
    uri = next((s.video.uri for s in answer.generated_samples if s.video is not None and s.video.uri), None)
    if uri is not None:
        return ProviderSignal(provider_job_id=op.name, state=ProviderState.SUCCEEDED, output_url=uri)
    if answer.rai_media_filtered_count > 0 or answer.rai_media_filtered_reasons:
        said = f"Veo's safety filters held the video back. {' '.join(answer.rai_media_filtered_reasons)}"
        error = http.said_error(ErrorCode.CONTENT_REJECTED, "Veo", said.strip())
    else:
        error = http.said_error(ErrorCode.PROVIDER_UNAVAILABLE, "Veo", "Veo finished without a video.")
    return ProviderSignal(provider_job_id=op.name, state=ProviderState.FAILED, error=error)


def _errored(name: str, status: Status) -> ProviderSignal:
    if status.code_name == "CANCELLED":
        return ProviderSignal(provider_job_id=name, state=ProviderState.CANCELED)
    said = f"{status.code_name}: {status.message}" if status.message else status.code_name
    return ProviderSignal(provider_job_id=name, state=ProviderState.FAILED,
                          error=http.said_error(status.meaning, "Veo", said))
