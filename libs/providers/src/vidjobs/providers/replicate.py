"""The adapter for Replicate: video models run as predictions through the official-model route, with webhooks
signed by Standard Webhooks. docs/PROVIDERS.md has the routes, the field mapping and the states it reads."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import msgspec

from vidjobs.common import signatures
from vidjobs.common.errors import ErrorCode, JobError, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, http, models
from vidjobs.providers.base import ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest, formats
from vidjobs.providers.http import ErrorTable, HttpAdapter, Said, SignedCallbacks, refusals

# Webhooks on creation and on the terminal state; `output` and `logs` would only repeat what a poll tells.
WEBHOOK_EVENTS = ("start", "completed")
TOKEN_SETTING = "VIDJOBS_REPLICATE_API_TOKEN"

# Replicate's words for a failed render that its safety checks stopped, e.g. "The input or output was flagged
# as sensitive. Please try again with different inputs. (E005)".
_CONTENT_WORDS = re.compile(r"nsfw|sensitive|safety|content polic|moderat|\(E005\)", re.IGNORECASE)
# A 429's body says when to come back: "Expected available in 1 second." / "resets in ~30s."
_THROTTLE_WAIT = re.compile(r"in ~?(\d+(?:\.\d+)?) ?s", re.IGNORECASE)

# What each documented model input a job may set through `params` must be.
PARAM_CHECKS: dict[str, checks.Check] = {"prompt_optimizer": checks.boolean, "subject_reference": checks.image_url,
                                         "cfg_scale": checks.number(0, 1)}


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """What one model takes: a row of `models/replicate.toml`. An `*_input` names the model's own input."""

    durations: tuple[int, ...]  # the clip lengths it makes, in seconds, shortest first
    duration_input: str | None = None  # None when the length is fixed
    aspect_ratios: tuple[str, ...]
    aspect_input: str | None = None  # None when the model has one shape and no input for it
    resolutions: tuple[str, ...]
    image_input: str | None = None  # the input taking the first frame
    negative_prompt_input: str | None = None
    params: tuple[str, ...] = ()


MODELS = models.load("replicate", dict[str, Model])


# --- Replicate's wire format, as far as we read it -----------------------------------------------------

STATES: dict[str, ProviderState] = {
    "starting": ProviderState.QUEUED,  # waiting for a worker (a cold boot can take minutes)
    "processing": ProviderState.RUNNING,
    "succeeded": ProviderState.SUCCEEDED,
    "failed": ProviderState.FAILED,
    "canceled": ProviderState.CANCELED,  # by its creator, or its deadline passed while it ran
    "aborted": ProviderState.CANCELED,  # its deadline passed before it started
}


class _Prediction(msgspec.Struct, kw_only=True):
    id: str
    status: Literal["starting", "processing", "succeeded", "failed", "canceled", "aborted"]
    output: Any = None  # the model's output: for these models one URL, for some others a list of URLs
    error: Any = None  # text when failed


class _Problem(msgspec.Struct, kw_only=True):
    """An error answer: RFC 7807 problem details (`detail`, `title`, `status`)."""

    detail: Any = None
    title: str | None = None


class _CreatePrediction(msgspec.Struct, kw_only=True, omit_defaults=True):
    input: dict[str, Any]
    webhook: str | None = None
    webhook_events_filter: list[str] | None = None


# --- the adapter ---------------------------------------------------------------------------------------


def _read(status: int, body: bytes) -> Said:
    said = _said(body) or ""
    wait = float(match.group(1)) if (match := _THROTTLE_WAIT.search(said)) else None
    return Said(said, retry_after=wait)


ERRORS = ErrorTable("Replicate", {**refusals(TOKEN_SETTING, key="API token"), 402: http.NO_CREDIT}, _read,
                    content_words=_CONTENT_WORDS)
http_error = ERRORS.error


class ReplicateAdapter(SignedCallbacks, HttpAdapter):
    name = "replicate"
    errors = ERRORS
    forgotten = "Replicate has no record of this prediction."

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_token: str, webhook_secret: str, *,
                 tolerance_s: float = signatures.DEFAULT_TOLERANCE_S):
        SignedCallbacks.__init__(self, webhook_secret, tolerance_s)
        HttpAdapter.__init__(self, session, base_url, api_token)
        # Without the signing secret no webhook could be trusted: ask for none and let polling find results.
        self.supports_callbacks = bool(webhook_secret)

    def says_missing(self, body: bytes) -> bool:
        return _said(body) is not None

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"replicate/{name}", durations_s=list(m.durations), rounds_up=True,
                          formats=formats(m.aspect_ratios, m.resolutions),
                          input_image="optional" if m.image_input else "none",
                          negative_prompt=m.negative_prompt_input is not None)
                for name, m in MODELS.items()]

    def validate(self, request: JobRequest) -> None:
        model = checks.pick_model(self.name, "Replicate", request.model_name, MODELS)
        model_id = f"replicate/{request.model_name}"
        checks.check_params(model_id, request.params, {p: PARAM_CHECKS[p] for p in model.params})
        checks.round_up(model_id, model.durations, request)
        checks.check_frame(model_id, [(a, r) for a in model.aspect_ratios for r in model.resolutions], request)
        checks.check_optional(model_id, request, negative_prompt=model.negative_prompt_input is not None,
                              input_image=model.image_input is not None)

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        body = _CreatePrediction(input=_model_input(req))
        if req.callback_url and self.supports_callbacks:
            body.webhook, body.webhook_events_filter = req.callback_url, list(WEBHOOK_EVENTS)
        owner, name = req.request.model_name.split("/", 1)
        path = f"/v1/models/{quote(owner, safe='')}/{quote(name, safe='')}/predictions"
        prediction = self.read(await self.send(path, body), _Prediction, "prediction")
        return Submission(provider_job_id=prediction.id, state=STATES[prediction.status])

    # `find` finds nothing: Replicate takes no idempotency key, and a prediction carries nothing of ours (not
    # even its webhook URL) to match an attempt by; its input is the same for every attempt of a job.

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        return await self.poll(_prediction_path(provider_job_id), provider_job_id, self.parse_callback)

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        # A prediction Replicate no longer has is nothing to stop.
        await self.call_known("POST", _prediction_path(provider_job_id) + "/cancel")

    def parse_callback(self, body: bytes) -> ProviderSignal:
        # The webhook body is the prediction, exactly as `GET /v1/predictions/{id}` answers it.
        return _signal(self.read(body, _Prediction, "prediction"))


# --- translation ---------------------------------------------------------------------------------------


def _stopped(status: str) -> JobError:
    if status == "aborted":
        return JobError.of(ErrorCode.TIMEOUT, "Replicate dropped the prediction: its deadline passed before it "
                                              "started.")
    return JobError.of(ErrorCode.CANCELED, "The prediction was canceled at Replicate.")


def _signal(prediction: _Prediction) -> ProviderSignal:
    state = STATES[prediction.status]
    error = None
    if state is ProviderState.FAILED:
        # Stopped by a safety check (its words say so), or anything else: a transient failure of the render.
        error = ERRORS.failure(str(prediction.error) if prediction.error else None)
    elif state is ProviderState.CANCELED:
        error = _stopped(prediction.status)
    return ProviderSignal(provider_job_id=prediction.id, state=state, error=error,
                          output_url=http.first_url(prediction.output) if state is ProviderState.SUCCEEDED else None)


def _model_input(req: SubmitRequest) -> dict[str, Any]:
    request, model = req.request, MODELS[req.request.model_name]
    given: dict[str, Any] = {"prompt": request.prompt, **request.params}
    if model.duration_input:
        given[model.duration_input] = checks.round_up(f"replicate/{request.model_name}", model.durations, request)
    if model.aspect_input:
        given[model.aspect_input] = request.aspect_ratio
    if request.negative_prompt and model.negative_prompt_input:
        given[model.negative_prompt_input] = request.negative_prompt
    if request.input_image is not None:
        if not req.input_image_url or model.image_input is None:
            raise ProviderError(ErrorCode.INTERNAL, "The input image has no address Replicate could fetch.")
        given[model.image_input] = req.input_image_url
    return given


def _prediction_path(provider_job_id: str) -> str:
    return f"/v1/predictions/{quote(provider_job_id, safe='')}"


def _said(body: bytes) -> str | None:
    """The words of a problem-details error body; None for a body of any other shape (not Replicate's own)."""
    problem = http.read_or_none(body, _Problem)
    if problem is None or (problem.detail is None and problem.title is None):
        return None
    return (http.detail_text(problem.detail) if isinstance(problem.detail, str) else "") or problem.title or ""
