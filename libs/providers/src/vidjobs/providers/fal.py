"""The adapter for fal.ai's queue API (`fal/<model id>`): requests queued, polled and canceled under the model's
app, webhooks signed with ED25519 (`fal_signature.py`). docs/PROVIDERS.md has the routes and bodies it reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, fal_queue, http, models
from vidjobs.providers.base import ModelInfo, ProviderSignal, Submission, SubmitRequest, formats
from vidjobs.providers.checks import boolean, invalid, number
from vidjobs.providers.fal_queue import NAME, Queued, Status, request_path
from vidjobs.providers.fal_signature import USER_ID_HEADER, Jwks, Verifier
from vidjobs.providers.http import ErrorTable, HttpAdapter, decode, lost

_KEY_HINT = "check VIDJOBS_FAL_API_KEY"

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


# --- the adapter ------------------------------------------------------------------------------------------


ERRORS = ErrorTable(NAME, http.rows((401, 403), http.key_refused("{title} refused our API key ({status}); "
                                                                + _KEY_HINT)), fal_queue.read_error)


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
        checks.check_value("duration_s", request.duration_s, spec.durations, request.model_name)
        checks.check_value("aspect_ratio", request.aspect_ratio, spec.aspect_ratios, request.model_name)
        checks.check_value("resolution", request.resolution, spec.resolutions, request.model_name)
        checks.check_optional(request.model_name, request, seed=spec.seed, negative_prompt=spec.negative_prompt)
        if spec.image and request.input_image is None:
            raise invalid(f"input_image: {request.model_name} animates an image; upload one and name it")
        if not spec.image and request.input_image is not None:
            raise invalid(f"input_image: {request.model_name} takes no image; use an image-to-video model")

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        params = {"fal_webhook": req.callback_url} if req.callback_url else None
        raw = await self.send(f"/{quote(req.request.model_name)}", _input(req), params=params)
        queued = decode(raw, Queued, NAME, "queue answer")
        return Submission(provider_job_id=queued.request_id, queue_position=queued.queue_position)

    # `find` finds nothing: fal takes no idempotency key and cannot look a request up by anything of ours. A
    # second submit after a crash inside the round trip leaves the first request's webhook matching no job.

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        for app in _apps(model_name):
            raw = await self.call_known("GET", request_path(app, provider_job_id, "/status"))
            if raw is None:  # not a request of this app
                continue
            status = decode(raw, Status, NAME, "status")
            signal = fal_queue.waiting(provider_job_id, status)
            return signal or await self._result(app, provider_job_id, status.response_url)
        return lost(provider_job_id, "fal no longer knows this render.")

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        for app in _apps(model_name):
            answer = await self.answer("PUT", request_path(app, provider_job_id, "/cancel"))
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
        return fal_queue.read_webhook(body)

    async def close(self) -> None:
        """The session belongs to the caller; only the key refresh is ours."""
        await self.jwks.close()

    async def _result(self, app: str, request_id: str, response_url: str | None) -> ProviderSignal:
        answer = await self.answer("GET", self._own(response_url) or request_path(app, request_id))
        if (signal := fal_queue.read_result(request_id, answer)) is None:
            raise ERRORS.error(*answer)
        return signal

    def _own(self, url: str | None) -> str | None:
        """The path of a URL fal handed us, used only when it points back at fal's queue: our key goes
        nowhere else."""
        return url.removeprefix(self.base_url) if url and url.startswith(self.base_url + "/") else None


# --- our request as fal's model input ---------------------------------------------------------------------


def _apps(model_name: str | None) -> tuple[str, ...]:
    """The apps to ask about a request (our provider job id is fal's bare request id): its model's alone, as
    fal files a request under its model's app. Only for a job whose model is not known here (None, or a model
    since dropped from models/fal.toml) is each app of ours asked in turn, until one does not answer 404."""
    spec = MODELS.get(model_name or "")
    return (spec.app,) if spec is not None else APPS


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
