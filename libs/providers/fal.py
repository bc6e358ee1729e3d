"""The adapter for fal.ai's queue API (`fal/<model id>`): requests queued, polled and canceled under the model's
app, webhooks signed with ED25519 (`fal_signature.py`). docs/PROVIDERS.md has the routes and bodies it reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec

from vidjobs.common.errors import ErrorCode, JobError, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, http, models
from vidjobs.providers.base import ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest, formats
from vidjobs.providers.checks import boolean, invalid, number
from vidjobs.providers.fal_signature import USER_ID_HEADER, Jwks, Verifier
from vidjobs.providers.http import Answer, ErrorTable, HttpAdapter, Refusal, Said, decode, lost

T = TypeVar("T")
NAME = "fal"
_KEY_HINT = "check VIDJOBS_FAL_API_KEY"
_MAX_SAID = 300  # characters of fal's own words carried into a job's error message

# --- the models we offer, and what each takes ------------------------------------------------------------

# What each `params` entry a model may take must be.
PARAM_CHECKS: dict[str, checks.Check] = {"cfg_scale": number(0, 1), "prompt_optimizer": boolean,
                                         "generate_audio": boolean, "enhance_prompt": boolean, "auto_fix": boolean}


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How one fal model takes our normalised request: a row of `models/fal.toml`. Each mapping is our value →
    the value fal is sent, "" for one the model accepts without being told."""

    app: str  # owner/name: where its requests' status, result and cancel URLs live
    durations: dict[int, str]
    aspect_ratios: dict[str, str]
    resolutions: dict[str, str]
    negative_prompt: bool = False
    seed: bool = False
    image: bool = False  # image-to-video: the input image is required and sent as `image_url`
    params: tuple[str, ...] = ()


MODELS = models.load("fal", dict[str, ModelSpec])
APPS = tuple(dict.fromkeys(spec.app for spec in MODELS.values()))

# fal's model error types that say fal (or a service behind it) failed, not the input.
_SERVER_TYPES = {"internal_server_error", "generation_timeout", "downstream_service_error",
                 "downstream_service_unavailable"}
_CONTENT_WORDS = ("content_policy", "content policy", "flagged by a content checker", "nsfw")
_INPUT_WORDS = ("validation", "invalid input", "status code: 422", "status code: 400")


# --- fal's wire format, as far as we read it --------------------------------------------------------------


class _Queued(msgspec.Struct, kw_only=True):
    request_id: str
    queue_position: int | None = None


class _Status(msgspec.Struct, kw_only=True):
    status: str
    queue_position: int | None = None
    response_url: str | None = None
    error: str | None = None
    error_type: str | None = None


class _File(msgspec.Struct, kw_only=True):
    url: str | None = None


class _Output(msgspec.Struct, kw_only=True):
    video: _File | None = None


class _DetailItem(msgspec.Struct, kw_only=True):
    loc: list[str | int] = []
    msg: str = ""
    type: str = ""


class _ErrorBody(msgspec.Struct, kw_only=True):
    detail: str | list[_DetailItem] | None = None
    error_type: str | None = None


class _Webhook(msgspec.Struct, kw_only=True):
    request_id: str
    status: str
    payload: Any = None
    error: str | None = None
    payload_error: str | None = None


# --- the adapter ------------------------------------------------------------------------------------------


def _read(status: int, raw: bytes) -> Said:
    body = http.read_or_none(raw, _ErrorBody)
    said = _said(body) or ""
    if status not in (400, 422):
        return Said(said)
    # fal judged the input at the door; its words say whether for its content or its shape.
    code = failure(said or f"HTTP {status}", body, refused=True).code
    return Said(said, Refusal(code, "{title} refused the request: {said}"))


ERRORS = ErrorTable(NAME, http.rows((401, 403), Refusal(ErrorCode.INTERNAL, "{title} refused our API key ({status}); "
                                                                       + _KEY_HINT)), _read)


class FalAdapter(HttpAdapter):
    name = NAME
    errors = ERRORS
    supports_callbacks = True
    echo_transport = False
    key_header = ("Authorization", "Key {}")

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str, jwks_url: str, *,
                 tolerance_s: float = 300, jwks: Jwks | None = None, prefetch_keys: bool = True,
                 user_id: str = ""):
        super().__init__(session, base_url, api_key)
        self.user_id = user_id  # ours; empty: not checked (every fal user's callbacks verify)
        self.jwks = jwks or Jwks(session, jwks_url)
        self.verifier = Verifier(self.jwks, tolerance_s=tolerance_s)
        if prefetch_keys:
            self.jwks.refresh_soon()  # built inside a running loop: the first webhook finds the keys

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"fal/{name}", durations_s=sorted(m.durations), formats=formats(m.aspect_ratios,
                                                                                          m.resolutions),
                          input_image="required" if m.image else "none", negative_prompt=m.negative_prompt,
                          seed=m.seed)
                for name, m in MODELS.items()]

    def validate(self, request: JobRequest) -> None:
        spec = checks.pick_model(self.name, NAME, request.model_name, MODELS)
        checks.check_params(request.model_name, request.params, {p: PARAM_CHECKS[p] for p in spec.params})
        _pick("duration_s", request.duration_s, spec.durations, request.model_name)
        _pick("aspect_ratio", request.aspect_ratio, spec.aspect_ratios, request.model_name)
        _pick("resolution", request.resolution, spec.resolutions, request.model_name)
        checks.check_optional(request.model_name, request, seed=spec.seed, negative_prompt=spec.negative_prompt)
        if spec.image and request.input_image is None:
            raise invalid(f"input_image: {request.model_name} animates an image; upload one and name it")
        if not spec.image and request.input_image is not None:
            raise invalid(f"input_image: {request.model_name} takes no image; use an image-to-video model")

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        params = {"fal_webhook": req.callback_url} if req.callback_url else None
        raw = await self.send(f"/{quote(req.request.model_name)}", _input(req), params=params)
        queued = decode(raw, _Queued, NAME, "queue answer")
        return Submission(provider_job_id=queued.request_id, queue_position=queued.queue_position)

    # `find` finds nothing: fal takes no idempotency key and cannot look a request up by anything of ours. A
    # second submit after a crash inside the round trip leaves the first request's webhook matching no job.

    async def status(self, provider_job_id: str, model_name: str | None = None) -> ProviderSignal:
        for app in _apps(model_name):
            raw = await self.call_known("GET", _request_path(app, provider_job_id, "/status"))
            if raw is not None:  # else not a request of this app
                return await self._signal(app, provider_job_id, decode(raw, _Status, NAME, "status"))
        return lost(provider_job_id, "fal no longer knows this render.")

    async def cancel(self, provider_job_id: str, model_name: str | None = None) -> None:
        for app in _apps(model_name):
            answer = await self.answer("PUT", _request_path(app, provider_job_id, "/cancel"))
            if answer.status == 404:
                continue
            if answer.ok or answer.status == 400:  # 400: ALREADY_COMPLETED, nothing left to stop
                return
            raise ERRORS.error(*answer)

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        # fal signs every customer's callbacks with one key set: a delivery for another fal user verifies
        # as well as ours, so the user id (part of the signed message) is compared first.
        claimed = headers.get(USER_ID_HEADER, "")
        if self.user_id and claimed != self.user_id:
            raise WebhookRejected(f"{USER_ID_HEADER} {claimed[:64]!r} is not our fal user")
        # With an async protocol this becomes `return await self.verifier.verify_fresh(headers, body)`.
        return self.verifier.verify(headers, body)

    def parse_callback(self, body: bytes) -> ProviderSignal:
        hook = decode(body, _Webhook, NAME, "webhook")
        match hook.status:
            case "OK":
                url = _video_url(hook.payload)
                # No usable payload (fal could not serialise it): the webhook only says where to look.
                return ProviderSignal(provider_job_id=hook.request_id, state=ProviderState.SUCCEEDED,
                                      output_url=url, verified=url is not None)
            case "ERROR":
                error = failure(hook.error, _error_body(hook.payload))
                return ProviderSignal(provider_job_id=hook.request_id, state=ProviderState.FAILED, error=error)
        raise ProviderError(ErrorCode.INTERNAL, f"fal sent a webhook with an unknown status {hook.status[:32]!r}")

    async def close(self) -> None:
        """The session belongs to the caller; only the key refresh is ours."""
        await self.jwks.close()

    async def _signal(self, app: str, request_id: str, st: _Status) -> ProviderSignal:
        match st.status:
            case "IN_QUEUE":
                return ProviderSignal(provider_job_id=request_id, state=ProviderState.QUEUED,
                                      queue_position=st.queue_position)
            case "IN_PROGRESS":
                return ProviderSignal(provider_job_id=request_id, state=ProviderState.RUNNING)
            case "COMPLETED" if st.error or st.error_type:
                body = _ErrorBody(detail=st.error, error_type=st.error_type)
                return ProviderSignal(provider_job_id=request_id, state=ProviderState.FAILED,
                                      error=failure(st.error, body))
            case "COMPLETED":
                return await self._result(app, request_id, st.response_url)
        raise ProviderError(ErrorCode.INTERNAL, f"fal reported an unknown request status {st.status[:32]!r}")

    async def _result(self, app: str, request_id: str, response_url: str | None) -> ProviderSignal:
        answer = await self.answer("GET", self._own(response_url) or _request_path(app, request_id))
        if answer.ok:
            payload = decode(answer.body, Any, NAME, "result")
            return ProviderSignal(provider_job_id=request_id, state=ProviderState.SUCCEEDED,
                                  output_url=_video_url(payload))
        body = http.read_or_none(answer.body, _ErrorBody)
        if not _render_failed(answer, body):
            raise ERRORS.error(*answer)
        error = failure(_said(body) or f"HTTP {answer.status}", body, refused=answer.status in (400, 422))
        return ProviderSignal(provider_job_id=request_id, state=ProviderState.FAILED, error=error)

    def _own(self, url: str | None) -> str | None:
        """The path of a URL fal handed us, used only when it points back at fal's queue: our key goes
        nowhere else."""
        return url.removeprefix(self.base_url) if url and url.startswith(self.base_url + "/") else None


def _request_path(app: str, request_id: str, tail: str = "") -> str:
    return f"/{quote(app)}/requests/{quote(request_id, safe='')}{tail}"


# --- translation ------------------------------------------------------------------------------------------


def failure(said: str | None, body: _ErrorBody | None, *, refused: bool = False) -> JobError:
    """A failed render in our taxonomy: refused content, an input the model cannot take, or fal's trouble.
    `refused`: fal answered 400/422, so it judged the input whatever its words."""
    items = body.detail if body is not None and isinstance(body.detail, list) else []
    text = " ".join([said or "", *(item.msg for item in items)]).lower()
    if any(item.type == "content_policy_violation" for item in items) or any(w in text for w in _CONTENT_WORDS):
        code = ErrorCode.CONTENT_REJECTED
    elif refused or any(item.type not in _SERVER_TYPES for item in items) or any(w in text for w in _INPUT_WORDS):
        code = ErrorCode.INVALID_INPUT
    else:
        code = ErrorCode.PROVIDER_UNAVAILABLE
    detail = _said(body) or said
    return http.said_error(code, NAME, detail[:_MAX_SAID] if detail else None)


def _render_failed(answer: Answer, body: _ErrorBody | None) -> bool:
    """A result fetch answered with the request's own failure (kept with the result), rather than a failure of
    the fetch itself (our key, our pace, fal being down)."""
    if answer.status in (401, 403, 408, 429):
        return False
    if answer.status == 422 or "X-Fal-Error-Type" in answer.headers:
        return True
    return body is not None and (isinstance(body.detail, list) or body.error_type is not None)


def _said(body: _ErrorBody | None) -> str | None:
    if body is None:
        return None
    if not body.detail:
        return body.error_type
    if isinstance(body.detail, str):
        return body.detail
    first = body.detail[0]
    where = ".".join(str(part) for part in first.loc if part != "body")
    return f"{where}: {first.msg}" if where else first.msg


def _error_body(payload: Any) -> _ErrorBody | None:
    return _convert(payload, _ErrorBody)


def _video_url(payload: Any) -> str | None:
    video = output.video if (output := _convert(payload, _Output)) is not None else None
    return video.url if video is not None and video.url else None


def _convert(payload: Any, kind: type[T]) -> T | None:
    """A webhook's or result's JSON object as `kind`; None for anything else (fal's payloads vary by model)."""
    try:
        return msgspec.convert(payload, kind) if isinstance(payload, dict) else None
    except msgspec.ValidationError:
        return None


# --- our request as fal's model input ---------------------------------------------------------------------


def _apps(model_name: str | None) -> tuple[str, ...]:
    spec = MODELS.get(model_name or "")
    return (spec.app,) if spec is not None else APPS


def _pick(field_name: str, value: Any, table: Mapping[Any, str | None], model_name: str) -> str | None:
    if value not in table:
        offered = " or ".join(str(v) for v in table)
        raise invalid(f"{field_name}: {model_name} takes {offered}, not {value}")
    return table[value]


def _input(req: SubmitRequest) -> dict[str, Any]:
    """The model's input body: only what the model takes, so fal's own defaults apply to the rest."""
    r, spec = req.request, MODELS[req.request.model_name]
    body: dict[str, Any] = {"prompt": r.prompt}
    mapped = {
        "duration": spec.durations[r.duration_s] or None,  # "": the model is not told
        "aspect_ratio": spec.aspect_ratios[r.aspect_ratio] or None,
        "resolution": spec.resolutions[r.resolution] or None,
        "negative_prompt": r.negative_prompt,
        "seed": r.seed,
    }
    body.update({name: value for name, value in mapped.items() if value is not None})
    if spec.image:
        if not req.input_image_url:
            raise ProviderError(ErrorCode.INTERNAL, "input_image: the upload has no URL to hand to fal")
        body["image_url"] = req.input_image_url
    return body | dict(r.params)
