"""The adapter for Runway's API (version 2024-11-06): tasks started, polled and deleted; no callbacks.
docs/PROVIDERS.md has the routes and states it reads."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec

from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, models
from vidjobs.providers.base import Format, ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest
from vidjobs.providers.http import ErrorTable, HttpAdapter, Said, decode, lost, read_or_none, refusals, said_error

API_VERSION = "2024-11-06"
KEY_SETTING = "VIDJOBS_RUNWAY_API_KEY"
MAX_PROMPT_UNITS = 1000  # Runway counts promptText in UTF-16 code units
# Runway bills a task in credits and sells API credits at $0.01 each (https://docs.dev.runwayml.com/guides/setup,
# "Add credits"), so a task's bill in USD is its credits / 100.
CREDITS_PER_USD = 100
MAX_BILLED_CREDITS = 100_000  # $1,000: far beyond any one render, so a larger figure is not believed

# What each `params` entry a model may take must be.
PARAM_CHECKS = {"public_figure_threshold": checks.one_of("auto", "low"), "audio": checks.boolean}


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """What one Runway model accepts: a row of `models/runway.toml`."""

    durations: tuple[int, ...]
    image_frames: str  # the frame set it renders from an image; "" when it cannot start from one
    text_frames: str = ""  # the frame set it renders from text; "": image only
    seed: bool = False
    negative_prompt: bool = False
    params: tuple[str, ...] = ()

    @property
    def needs_image(self) -> bool:
        return not self.text_frames

    def frames(self, has_image: bool) -> dict[tuple[str, str], str]:
        """Our (aspect ratio, resolution) -> Runway's output frame ("width:height" in pixels)."""
        return FRAMES.get(self.image_frames if has_image else self.text_frames, {})


class _Catalog(msgspec.Struct):
    frames: dict[str, dict[str, str]]
    models: dict[str, Model]


_CATALOG = models.load("runway", _Catalog)
FRAMES = models.frame_sets(_CATALOG.frames)
MODELS = _CATALOG.models
TEXT_MODELS = tuple(f"runway/{name}" for name, m in MODELS.items() if not m.needs_image)


def _model_info(name: str, m: Model) -> ModelInfo:
    text = [Format(*pair) for pair in m.frames(False)]
    image = [Format(*pair) for pair in m.frames(True)]
    return ModelInfo(id=f"runway/{name}", durations_s=list(m.durations), formats=text or image,
                     formats_with_image=None if image == text or not text else image or None,
                     input_image="required" if m.needs_image else "optional" if image else "none",
                     negative_prompt=m.negative_prompt, seed=m.seed)


# --- Runway's wire format, as far as we read it ---------------------------------------------------------


class _Created(msgspec.Struct):
    id: str


class _Cost(msgspec.Struct):
    credits: float


class _Task(msgspec.Struct, kw_only=True, rename="camel"):
    id: str
    status: str
    progress: float | None = None
    output: list[str] | None = None
    failure: str | None = None
    failure_code: str | None = None
    # Credits an ended task was billed. One under way has only `estimatedCost`, at current prices: not a bill.
    cost: _Cost | None = None


class _ErrorAnswer(msgspec.Struct):
    error: str = ""


# --- the adapter ---------------------------------------------------------------------------------------


def _said(status: int, body: bytes) -> Said:
    answer = read_or_none(body, _ErrorAnswer)
    return Said(answer.error if answer else "")


ERRORS = ErrorTable("Runway", refusals(KEY_SETTING, inputs=(400, 413, 415, 422)), _said)
http_error = ERRORS.error


class RunwayAdapter(HttpAdapter):
    name = "runway"
    errors = ERRORS
    echo_transport = False
    api_headers = {"X-Runway-Version": API_VERSION}

    def models(self) -> list[ModelInfo]:
        return [_model_info(name, m) for name, m in MODELS.items()]

    def validate(self, request: JobRequest) -> None:
        model = checks.pick_model(self.name, "Runway", request.model_name, MODELS)
        model_id, has_image = f"runway/{request.model_name}", request.input_image is not None
        if model.needs_image and not has_image:
            raise checks.invalid(f"input_image: {model_id} renders from an image, so it needs input_image; "
                          f"for a prompt alone choose {' or '.join(TEXT_MODELS)}")
        checks.check_frame(model_id, model.frames(has_image), request)
        checks.check_duration(model_id, model.durations, request)
        checks.check_optional(model_id, request, seed=model.seed, negative_prompt=model.negative_prompt,
                              max_seed=checks.UINT32_MAX)
        if (units := len(request.prompt.encode("utf-16-le")) // 2) > MAX_PROMPT_UNITS:
            raise checks.invalid(f"prompt: Runway takes at most {MAX_PROMPT_UNITS} characters, this one has {units}")
        checks.check_params(model_id, request.params, {p: PARAM_CHECKS[p] for p in model.params})

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        if req.request.input_image is not None and not req.input_image_url:
            raise checks.invalid("input_image: the image has no address Runway could fetch it from")
        path = "/v1/image_to_video" if req.request.input_image is not None else "/v1/text_to_video"
        raw = await self.call("POST", path, json=task_body(req))
        return Submission(provider_job_id=decode(raw, _Created, "Runway").id, state=ProviderState.QUEUED)

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        raw = await self.call_known("GET", _task_path(provider_job_id))
        # Runway forgets deleted tasks; this one will never finish.
        return lost(provider_job_id, "Runway no longer knows this render.") if raw is None else read_task(raw)

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        # DELETE aborts a pending, throttled or running task (and deletes a finished one, whose output we no
        # longer want either: only renders still in flight are ever canceled). A task already gone is no error.
        await self.call_known("DELETE", _task_path(provider_job_id))


# --- translation ---------------------------------------------------------------------------------------


def task_body(req: SubmitRequest) -> dict[str, Any]:
    """The JSON body that starts a task for this request (validated already)."""
    r = req.request
    model = MODELS[r.model_name]
    body: dict[str, Any] = {
        "model": r.model_name, "promptText": r.prompt, "duration": r.duration_s,
        "ratio": model.frames(r.input_image is not None)[(r.aspect_ratio, r.resolution)],
    }
    if r.input_image is not None:
        body["promptImage"] = req.input_image_url
    if r.seed is not None:
        body["seed"] = r.seed
    if r.negative_prompt:
        body["negativePrompt"] = r.negative_prompt
    if "public_figure_threshold" in r.params:
        body["contentModeration"] = {"publicFigureThreshold": r.params["public_figure_threshold"]}
    if "audio" in r.params:
        body["audio"] = r.params["audio"]
    return body


STATES = {
    # THROTTLED is not an error: Runway holds the task until one of our account's concurrent renders ends.
    "PENDING": ProviderState.QUEUED, "THROTTLED": ProviderState.QUEUED, "RUNNING": ProviderState.RUNNING,
    "SUCCEEDED": ProviderState.SUCCEEDED, "FAILED": ProviderState.FAILED, "CANCELLED": ProviderState.CANCELED,
}
ENDED = (ProviderState.SUCCEEDED, ProviderState.FAILED, ProviderState.CANCELED)


def read_task(raw: bytes) -> ProviderSignal:
    """A `GET /v1/tasks/{id}` answer as a signal; ProviderError(INTERNAL) when it breaks Runway's schema."""
    task = decode(raw, _Task, "Runway")
    if (state := STATES.get(task.status)) is None:
        raise ProviderError(ErrorCode.INTERNAL, f"Runway reported an unknown task status {task.status!r}")
    progress = task.progress if task.progress is not None and 0 <= task.progress <= 1 else None
    failed = said_error(failure_code(task.failure_code), "Runway", task.failure)
    # What an ended task was billed, in USD; a figure beyond any render's is dropped, as a progress outside 0..1 is.
    billed = task.cost.credits if task.cost is not None and state in ENDED else None
    return ProviderSignal(
        provider_job_id=task.id, state=state, progress=progress if state is ProviderState.RUNNING else None,
        output_url=task.output[0] if state is ProviderState.SUCCEEDED and task.output else None,
        error=failed if state is ProviderState.FAILED else None,
        cost=billed / CREDITS_PER_USD if billed is not None and 0 <= billed <= MAX_BILLED_CREDITS else None)


def failure_code(code: str | None) -> ErrorCode:
    """Runway's dot-separated failureCode in our taxonomy: a SAFETY segment anywhere is refused content, an
    INTERNAL one Runway's trouble, an input stage an unusable input (docs/PROVIDERS.md lists the codes)."""
    segments = (code or "").upper().split(".")
    if "SAFETY" in segments:
        return ErrorCode.CONTENT_REJECTED
    if "INTERNAL" in segments:
        return ErrorCode.PROVIDER_UNAVAILABLE
    if segments[0] in ("ASSET", "INPUT_PREPROCESSING"):
        return ErrorCode.INVALID_INPUT
    return ErrorCode.PROVIDER_UNAVAILABLE


def _task_path(task_id: str) -> str:
    return f"/v1/tasks/{quote(task_id, safe='')}"
