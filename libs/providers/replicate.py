"""The adapter for Replicate: video models run as Replicate predictions.

A model is named `replicate/<owner>/<name>` and run through the official-model route
`POST /v1/models/{owner}/{name}/predictions` (Replicate picks the model's current version). Only the models in
`MODELS` are offered: each entry lists the inputs the model documents, so a request is checked here, with a
message naming our field, instead of failing later at Replicate.

Our fields map onto a model's inputs as follows:
  duration_s    the shortest clip length the model makes that is at least as long as asked (never shorter);
                longer than its longest: refused
  aspect_ratio  passed through where the model takes one; refused where the model cannot make it
  resolution    refused unless the model renders it (both models here render 720p only)
  negative_prompt, seed, input_image   passed to the model's own input, or refused if it has none

Signals come two ways: a webhook, signed with Standard Webhooks headers under the account's `whsec_` secret
and asked for only on `start` and `completed`, and `GET /v1/predictions/{id}`. Replicate deletes a
prediction's files an hour after it finishes, so a success moves the job to downloading at once.

Replicate takes no idempotency key and echoes nothing of ours in a prediction, so webhooks are matched to
jobs by prediction id (recorded by the submitter) and `find` cannot look an attempt up (see `find`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import msgspec

from vidjobs.common.errors import DEFAULT_MESSAGES, ErrorCode, JobError, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import webhooks
from vidjobs.providers.base import (
    ModelInfo,
    ProviderSignal,
    ProviderState,
    Submission,
    SubmitRequest,
    formats,
)
from vidjobs.providers.checks import invalid, is_number, pick_model
from vidjobs.providers.http import (
    INPUT_STATUSES,
    ErrorTable,
    HttpAdapter,
    Refusal,
    Said,
    SignedCallbacks,
    decode,
    lost,
    rows,
)

# Webhooks on creation and on the terminal state; `output` and `logs` would only repeat what a poll tells.
WEBHOOK_EVENTS = ("start", "completed")
TOKEN_SETTING = "VIDJOBS_REPLICATE_API_TOKEN"

# Replicate's words for a failed render that its safety checks stopped, e.g. "The input or output was flagged
# as sensitive. Please try again with different inputs. (E005)".
_CONTENT_WORDS = re.compile(r"nsfw|sensitive|safety|content polic|moderat|\(E005\)", re.IGNORECASE)
# A 429's body says when to come back: "Expected available in 1 second." / "resets in ~30s."
_THROTTLE_WAIT = re.compile(r"in ~?(\d+(?:\.\d+)?) ?s", re.IGNORECASE)


# --- what each model takes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One documented model input that a job may set through `params`."""

    kind: Literal["bool", "number", "url"]
    lo: float | None = None
    hi: float | None = None

    def problem(self, value: object) -> str | None:
        """Why `value` cannot be given to this input, or None if it can."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else "must be true or false"
        if self.kind == "url":
            ok = isinstance(value, str) and value.startswith(("https://", "http://"))
            return None if ok else "must be an http(s) URL of an image"
        if not is_number(value):
            return "must be a number"
        assert isinstance(value, int | float)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            return f"must be from {self.lo:g} to {self.hi:g}"
        return None


@dataclass(frozen=True)
class Model:
    durations: tuple[int, ...]  # the clip lengths it makes, in seconds, shortest first
    duration_input: str | None  # the input naming the length; None when the length is fixed
    aspect_ratios: tuple[str, ...]
    aspect_input: str | None  # None when the model has one shape and no input for it
    resolutions: tuple[str, ...]
    image_input: str | None  # the input taking the first frame
    negative_prompt_input: str | None
    params: Mapping[str, Param] = field(default_factory=dict)


MODELS: dict[str, Model] = {
    # 6 s at 720p, 16:9 (or the first frame's shape); https://replicate.com/minimax/video-01/api
    "minimax/video-01": Model(
        durations=(6,), duration_input=None, aspect_ratios=("16:9",), aspect_input=None, resolutions=("720p",),
        image_input="first_frame_image", negative_prompt_input=None,
        params={"prompt_optimizer": Param("bool"), "subject_reference": Param("url")},
    ),
    # 5 or 10 s at 720p; https://replicate.com/kwaivgi/kling-v2.0/api
    "kwaivgi/kling-v2.0": Model(
        durations=(5, 10), duration_input="duration", aspect_ratios=("16:9", "9:16", "1:1"),
        aspect_input="aspect_ratio", resolutions=("720p",), image_input="start_image",
        negative_prompt_input="negative_prompt", params={"cfg_scale": Param("number", lo=0, hi=1)},
    ),
}


# --- Replicate's wire format, as far as we read it -----------------------------------------------------

Status = Literal["starting", "processing", "succeeded", "failed", "canceled", "aborted"]

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
    status: Status
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
    said = _said(_problem(body))
    wait = float(match.group(1)) if (match := _THROTTLE_WAIT.search(said)) else None
    refused = status in INPUT_STATUSES and _CONTENT_WORDS.search(said)
    return Said(said, _CONTENT_REFUSED if refused else None, wait)


_CONTENT_REFUSED = Refusal(ErrorCode.CONTENT_REJECTED, "{title} refused the request: {said}")
ERRORS = ErrorTable("Replicate", {
    **rows((401, 403), Refusal(ErrorCode.INTERNAL, "{title} refused our API token ({status}: {said}); check the "
                                                   f"{TOKEN_SETTING} setting.")),
    402: Refusal(ErrorCode.INTERNAL, "Our {title} account is out of credit: {said}"),
    **rows(INPUT_STATUSES, Refusal(ErrorCode.INVALID_INPUT, "{title} refused the request: {said}")),
}, _read)
http_error = ERRORS.error


class ReplicateAdapter(SignedCallbacks, HttpAdapter):
    name = "replicate"
    errors = ERRORS

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_token: str, webhook_secret: str, *,
                 tolerance_s: float = webhooks.DEFAULT_TOLERANCE_S):
        SignedCallbacks.__init__(self, webhook_secret, tolerance_s)
        HttpAdapter.__init__(self, session, base_url)
        self._auth = {"Authorization": f"Bearer {api_token}"}
        # Without the signing secret no webhook could be trusted: ask for none and let polling find results.
        self.supports_callbacks = bool(webhook_secret)

    def auth_headers(self) -> dict[str, str]:
        return self._auth

    def says_missing(self, body: bytes) -> bool:
        return _problem(body) is not None

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"replicate/{name}", durations_s=list(m.durations), rounds_up=True,
                          formats=formats(m.aspect_ratios, m.resolutions),
                          input_image="optional" if m.image_input else "none",
                          negative_prompt=m.negative_prompt_input is not None)
                for name, m in MODELS.items()]

    def validate(self, request: JobRequest) -> None:
        model = pick_model(self.name, "Replicate", request.model_name, MODELS)
        for name, value in request.params.items():
            param = model.params.get(name)
            if param is None:
                known = ", ".join(model.params) or "none"
                raise invalid(f"params.{name}: not an input of {request.model_name} (it takes: {known})")
            if (problem := param.problem(value)) is not None:
                raise invalid(f"params.{name}: {problem}, not {value!r}")
        _clip_length(request, model)
        if request.aspect_ratio not in model.aspect_ratios:
            raise invalid(f"aspect_ratio: {request.model_name} makes {', '.join(model.aspect_ratios)} videos, "
                          f"not {request.aspect_ratio}")
        if request.resolution not in model.resolutions:
            raise invalid(f"resolution: {request.model_name} renders {', '.join(model.resolutions)} only, "
                          f"not {request.resolution}")
        if request.negative_prompt and model.negative_prompt_input is None:
            raise invalid(f"negative_prompt: {request.model_name} takes no negative prompt; leave it out")
        if request.seed is not None:
            raise invalid(f"seed: {request.model_name} takes no seed; leave it out")
        if request.input_image is not None and model.image_input is None:
            raise invalid(f"input_image: {request.model_name} takes no input image")

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        body = _CreatePrediction(input=_model_input(req))
        if req.callback_url and self.supports_callbacks:
            body.webhook, body.webhook_events_filter = req.callback_url, list(WEBHOOK_EVENTS)
        owner, name = req.request.model_name.split("/", 1)
        path = f"/v1/models/{quote(owner, safe='')}/{quote(name, safe='')}/predictions"
        raw = await self.call("POST", path, data=msgspec.json.encode(body),
                              headers={"Content-Type": "application/json"})
        prediction = _decode(raw)
        return Submission(provider_job_id=prediction.id, state=STATES[prediction.status])

    # `find` finds nothing: Replicate takes no idempotency key, and a prediction carries nothing of ours (not
    # even its webhook URL) to match an attempt by; its input is the same for every attempt of a job.

    async def status(self, provider_job_id: str) -> ProviderSignal:
        raw = await self.call_known("GET", _prediction_path(provider_job_id))
        if raw is None:
            return lost(provider_job_id, "Replicate has no record of this prediction.")
        return _signal(_decode(raw))

    async def cancel(self, provider_job_id: str) -> None:
        # A prediction Replicate no longer has is nothing to stop.
        await self.call_known("POST", _prediction_path(provider_job_id) + "/cancel")

    def parse_callback(self, body: bytes) -> ProviderSignal:
        # The webhook body is the prediction, exactly as `GET /v1/predictions/{id}` answers it.
        return _signal(_decode(body))


# --- translation ---------------------------------------------------------------------------------------


def failure(error: object) -> JobError:
    """A failed prediction's error in our taxonomy: stopped by a safety check, or (anything else) a
    transient failure of the render."""
    text = str(error).strip() if error else ""
    code = ErrorCode.CONTENT_REJECTED if _CONTENT_WORDS.search(text) else ErrorCode.PROVIDER_UNAVAILABLE
    detail = f" Replicate said: {text[:500]}" if text else ""
    return JobError.of(code, DEFAULT_MESSAGES[code] + detail)


def _stopped(status: str) -> JobError:
    if status == "aborted":
        return JobError.of(ErrorCode.TIMEOUT, "Replicate dropped the prediction: its deadline passed before it "
                                              "started.")
    return JobError.of(ErrorCode.CANCELED, "The prediction was canceled at Replicate.")


def output_url(output: object) -> str | None:
    """The video's URL: the output itself, or the first URL of a list of outputs."""
    if isinstance(output, list):
        output = next((item for item in output if isinstance(item, str)), None)
    return output if isinstance(output, str) and output else None


def _signal(prediction: _Prediction) -> ProviderSignal:
    state = STATES[prediction.status]
    error = None
    if state is ProviderState.FAILED:
        error = failure(prediction.error)
    elif state is ProviderState.CANCELED:
        error = _stopped(prediction.status)
    return ProviderSignal(
        provider_job_id=prediction.id, state=state, error=error,
        output_url=output_url(prediction.output) if state is ProviderState.SUCCEEDED else None,
    )


def _clip_length(request: JobRequest, model: Model) -> int:
    length = next((d for d in model.durations if d >= request.duration_s), None)
    if length is None:
        made = " or ".join(f"{d} s" for d in model.durations)
        raise invalid(f"duration_s: {request.model_name} makes {made} clips; {request.duration_s} s is longer")
    return length


def _model_input(req: SubmitRequest) -> dict[str, Any]:
    request = req.request
    model = MODELS[request.model_name]
    given: dict[str, Any] = {"prompt": request.prompt, **request.params}
    if model.duration_input:
        given[model.duration_input] = _clip_length(request, model)
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


def _decode(raw: bytes) -> _Prediction:
    return decode(raw, _Prediction, "Replicate", "prediction")


def _problem(body: bytes) -> _Problem | None:
    try:
        problem = msgspec.json.decode(body, type=_Problem)
    except msgspec.DecodeError:
        return None
    return problem if problem.detail is not None or problem.title is not None else None


def _said(problem: _Problem | None) -> str:
    if problem is None:
        return ""
    detail = problem.detail if isinstance(problem.detail, str) else ""
    return " ".join(detail.split()) or problem.title or ""
