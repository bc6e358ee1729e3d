"""The adapter for Runway's API (https://docs.dev.runwayml.com, API version 2024-11-06): polling only.

A render is a task: `POST /v1/text_to_video` or `/v1/image_to_video` starts one and answers its id,
`GET /v1/tasks/{id}` says where it stands (PENDING, THROTTLED, RUNNING with a 0..1 progress, SUCCEEDED with
`output` URLs, FAILED with `failure` and `failureCode`, CANCELLED) and `DELETE /v1/tasks/{id}` stops it.
Runway sends no callbacks, so every signal comes from the poller's tapered status polls.

Output URLs are signed and expire 24 to 48 hours after the task finishes; the media service copies the render
into our bucket long before that. They need no credentials, so `download_headers` sends none: our API key
never travels to the CDN that serves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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

API_VERSION = "2024-11-06"
KEY_SETTING = "VIDJOBS_RUNWAY_API_KEY"
MAX_PROMPT_UNITS = 1000  # Runway counts promptText in UTF-16 code units
MAX_SEED = 2**32 - 1

# Our aspect ratio and resolution as Runway's output frame ("width:height" in pixels), per model family.
_GEN4_FRAMES = {("16:9", "720p"): "1280:720", ("9:16", "720p"): "720:1280", ("1:1", "720p"): "960:960"}
_GEN4_TEXT_FRAMES = {("16:9", "720p"): "1280:720", ("9:16", "720p"): "720:1280"}
# Gen-3 Alpha Turbo's frames are 1280x768 and 768x1280: the nearest it comes to 16:9 and 9:16.
_GEN3_FRAMES = {("16:9", "720p"): "1280:768", ("9:16", "720p"): "768:1280"}
_VEO_FRAMES = {("16:9", "720p"): "1280:720", ("9:16", "720p"): "720:1280",
               ("16:9", "1080p"): "1920:1080", ("9:16", "1080p"): "1080:1920"}

# Our `params` a model may take: name -> (check, what it must be).
_PARAM_CHECKS: dict[str, tuple[Any, str]] = {
    "public_figure_threshold": (lambda v: v in ("auto", "low"), '"auto" or "low"'),
    "audio": (lambda v: isinstance(v, bool), "true or false"),
}


@dataclass(frozen=True)
class Model:
    """What one Runway model accepts, from the API reference's request schemas."""

    name: str
    durations: tuple[int, ...]
    image_frames: Mapping[tuple[str, str], str]  # image_to_video; empty when the model cannot start from an image
    text_frames: Mapping[tuple[str, str], str] = field(default_factory=dict)  # text_to_video; empty: image only
    seed: bool = False
    negative_prompt: bool = False
    params: tuple[str, ...] = ()

    @property
    def needs_image(self) -> bool:
        return not self.text_frames

    def frames(self, has_image: bool) -> Mapping[tuple[str, str], str]:
        return self.image_frames if has_image else self.text_frames


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("gen4_turbo", tuple(range(2, 11)), _GEN4_FRAMES, seed=True, params=("public_figure_threshold",)),
    Model("gen3a_turbo", (5, 10), _GEN3_FRAMES, seed=True, params=("public_figure_threshold",)),
    Model("gen4.5", tuple(range(2, 11)), _GEN4_FRAMES, _GEN4_TEXT_FRAMES, seed=True,
          params=("public_figure_threshold",)),
    Model("veo3", (8,), _VEO_FRAMES, _VEO_FRAMES),
    Model("veo3.1", (4, 6, 8), _VEO_FRAMES, _VEO_FRAMES, negative_prompt=True, params=("audio",)),
    Model("veo3.1_fast", (4, 6, 8), _VEO_FRAMES, _VEO_FRAMES, negative_prompt=True, params=("audio",)),
)}
TEXT_MODELS = tuple(f"runway/{m.name}" for m in MODELS.values() if not m.needs_image)


def _model_info(m: Model) -> ModelInfo:
    text = [Format(*pair) for pair in m.text_frames]
    image = [Format(*pair) for pair in m.image_frames]
    if m.needs_image:
        return ModelInfo(id=f"runway/{m.name}", durations_s=list(m.durations), formats=image, input_image="required",
                         negative_prompt=m.negative_prompt, seed=m.seed)
    return ModelInfo(id=f"runway/{m.name}", durations_s=list(m.durations), formats=text,
                     formats_with_image=None if image == text or not image else image,
                     input_image="optional" if image else "none", negative_prompt=m.negative_prompt, seed=m.seed)


# --- Runway's wire format, as far as we read it ---------------------------------------------------------


class _Created(msgspec.Struct):
    id: str


class _Task(msgspec.Struct, kw_only=True, rename="camel"):
    id: str
    status: str
    progress: float | None = None
    output: list[str] | None = None
    failure: str | None = None
    failure_code: str | None = None


class _ErrorAnswer(msgspec.Struct):
    error: str = ""


# --- the adapter ---------------------------------------------------------------------------------------


def _said(status: int, body: bytes) -> Said:
    try:
        return Said(msgspec.json.decode(body, type=_ErrorAnswer).error)
    except msgspec.DecodeError:
        return Said()


ERRORS = ErrorTable("Runway", {
    **rows((401, 403), Refusal(ErrorCode.INTERNAL, "{title} refused our API key ({status}): check " + KEY_SETTING)),
    **rows((400, 413, 415, 422), Refusal(ErrorCode.INVALID_INPUT, "{title} cannot render this request: {said}")),
}, _said)
http_error = ERRORS.error


class RunwayAdapter(HttpAdapter):
    name = "runway"
    errors = ERRORS
    echo_transport = False

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str):
        super().__init__(session, base_url)
        self._api_key = api_key

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}", "X-Runway-Version": API_VERSION}

    def models(self) -> list[ModelInfo]:
        return [_model_info(m) for m in MODELS.values()]

    def validate(self, request: JobRequest) -> None:
        model = pick_model(self.name, "Runway", request.model_name, MODELS)
        has_image = request.input_image is not None
        if model.needs_image and not has_image:
            raise invalid(f"input_image: runway/{model.name} renders from an image, so it needs input_image; "
                          f"for a prompt alone choose {' or '.join(TEXT_MODELS)}")
        check_frame(f"runway/{model.name}", model.frames(has_image), request)
        if request.duration_s not in model.durations:
            raise invalid(f"duration_s: runway/{model.name} renders clips of {listed(model.durations)} seconds, "
                          f"not {request.duration_s}")
        if request.seed is not None and not (model.seed and 0 <= request.seed <= MAX_SEED):
            raise invalid(f"seed: runway/{model.name} takes no seed; leave it null" if not model.seed
                          else f"seed: must be from 0 to {MAX_SEED}")
        if request.negative_prompt is not None and not model.negative_prompt:
            raise invalid(f"negative_prompt: runway/{model.name} takes no negative prompt; leave it null")
        if (units := len(request.prompt.encode("utf-16-le")) // 2) > MAX_PROMPT_UNITS:
            raise invalid(f"prompt: Runway takes at most {MAX_PROMPT_UNITS} characters, this one has {units}")
        _check_params(model, request.params)

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        if req.request.input_image is not None and not req.input_image_url:
            raise invalid("input_image: the image has no address Runway could fetch it from")
        path = "/v1/image_to_video" if req.request.input_image is not None else "/v1/text_to_video"
        raw = await self.call("POST", path, json=task_body(req))
        return Submission(provider_job_id=decode(raw, _Created, "Runway").id, state=ProviderState.QUEUED)

    async def status(self, provider_job_id: str) -> ProviderSignal:
        raw = await self.call_known("GET", _task_path(provider_job_id))
        # Runway forgets deleted tasks; this one will never finish.
        return lost(provider_job_id, "Runway no longer knows this render.") if raw is None else read_task(raw)

    async def cancel(self, provider_job_id: str) -> None:
        # DELETE aborts a pending, throttled or running task (and deletes a finished one, whose output we no
        # longer want either: only renders still in flight are ever canceled). A task already gone is no error.
        await self.call_known("DELETE", _task_path(provider_job_id))


# --- translation ---------------------------------------------------------------------------------------


def task_body(req: SubmitRequest) -> dict[str, Any]:
    """The JSON body that starts a task for this request (validated already)."""
    r = req.request
    model = MODELS[r.model_name]
    body: dict[str, Any] = {
        "model": model.name, "promptText": r.prompt, "duration": r.duration_s,
        "ratio": model.frames(r.input_image is not None)[(r.aspect_ratio, r.resolution)],
    }
    if r.input_image is not None:
        body["promptImage"] = req.input_image_url
    if r.seed is not None:
        body["seed"] = r.seed
    if r.negative_prompt is not None:
        body["negativePrompt"] = r.negative_prompt
    if "public_figure_threshold" in r.params:
        body["contentModeration"] = {"publicFigureThreshold": r.params["public_figure_threshold"]}
    if "audio" in r.params:
        body["audio"] = r.params["audio"]
    return body


def read_task(raw: bytes) -> ProviderSignal:
    """A `GET /v1/tasks/{id}` answer as a signal; ProviderError(INTERNAL) when it breaks Runway's schema."""
    return task_signal(decode(raw, _Task, "Runway"))


def task_signal(task: _Task) -> ProviderSignal:
    """A task as Runway reports it, as a signal of ours."""
    match task.status:
        # THROTTLED is not an error: Runway holds the task until one of our account's concurrent renders ends,
        # then runs it. It is waiting in a queue, exactly like PENDING.
        case "PENDING" | "THROTTLED":
            return ProviderSignal(provider_job_id=task.id, state=ProviderState.QUEUED)
        case "RUNNING":
            progress = task.progress if task.progress is not None and 0 <= task.progress <= 1 else None
            return ProviderSignal(provider_job_id=task.id, state=ProviderState.RUNNING, progress=progress)
        case "SUCCEEDED":
            url = task.output[0] if task.output else None
            return ProviderSignal(provider_job_id=task.id, state=ProviderState.SUCCEEDED, output_url=url)
        case "FAILED":
            error = failure_error(task.failure_code, task.failure)
            return ProviderSignal(provider_job_id=task.id, state=ProviderState.FAILED, error=error)
        case "CANCELLED":
            return ProviderSignal(provider_job_id=task.id, state=ProviderState.CANCELED)
    raise ProviderError(ErrorCode.INTERNAL, f"Runway reported an unknown task status {task.status!r}")


def failure_code(code: str | None) -> ErrorCode:
    """Runway's dot-separated failureCode (most generic segment first) in our taxonomy.

    Content moderation shows as a SAFETY segment, first (SAFETY.INPUT.TEXT, SAFETY.OUTPUT.VIDEO) or after the
    stage (INPUT_PREPROCESSING.SAFETY.TEXT); it is never retried. An INTERNAL segment (INTERNAL.BAD_OUTPUT.*,
    INPUT_PREPROCESSING.INTERNAL: moderation itself failed) is Runway's trouble and may pass on a retry. The
    remaining input stages (ASSET.INVALID, other INPUT_PREPROCESSING.*) mean the input cannot be used."""
    segments = (code or "").upper().split(".")
    if "SAFETY" in segments:
        return ErrorCode.CONTENT_REJECTED
    if "INTERNAL" in segments:
        return ErrorCode.PROVIDER_UNAVAILABLE
    if segments[0] in ("ASSET", "INPUT_PREPROCESSING"):
        return ErrorCode.INVALID_INPUT
    return ErrorCode.PROVIDER_UNAVAILABLE


def failure_error(code: str | None, failure: str | None) -> JobError:
    ours = failure_code(code)
    said = f" Runway said: {failure}" if failure else ""
    return JobError.of(ours, DEFAULT_MESSAGES[ours] + said)


def _task_path(task_id: str) -> str:
    return f"/v1/tasks/{quote(task_id, safe='')}"


# --- validation ----------------------------------------------------------------------------------------


def _check_params(model: Model, params: Mapping[str, Any]) -> None:
    for name, value in params.items():
        if name not in model.params:
            takes = f"it takes {', '.join(model.params)}" if model.params else "it takes none"
            raise invalid(f"params.{name}: not a parameter of runway/{model.name} ({takes})")
        check, wanted = _PARAM_CHECKS[name]
        if not check(value):
            raise invalid(f"params.{name}: must be {wanted}, not {value!r}")
