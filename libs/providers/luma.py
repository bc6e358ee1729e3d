"""The adapter for Luma's Dream Machine API: video generations from the Ray models.

A model is named `luma/<model>` (`luma/ray-2`, `luma/ray-flash-2`) and started with
`POST /dream-machine/v1/generations`; `GET /dream-machine/v1/generations/{id}` says where it stands.

Our fields map onto a generation request as follows:
  duration_s    Ray makes 5 s and 9 s clips: up to 5 s asks for "5s", 6 to 9 s for "9s" (never shorter than
                asked); longer is refused
  aspect_ratio  passed through (Luma takes all three of ours)
  resolution    480p asks for Luma's smallest, 540p; 720p and 1080p pass through
  input_image   the first keyframe (`keyframes.frame0`, an image by URL)
  negative_prompt, seed   refused: Ray takes neither

Luma POSTs the generation to `callback_url` when it starts dreaming, completes or fails, but signs nothing.
A callback therefore only says where to look: `verify_callback` accepts any well-formed generation under a
delivery id of its own, and `parse_callback` marks the signal unverified, so the poller asks Luma for the
generation before acting on it.

Luma takes no idempotency key either. The callback URL carries our job id and attempt in its query, and Luma
echoes the request (callback URL included) in every generation, so `find` can look an attempt up among the
account's recent generations before anything is submitted again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import aiohttp
import msgspec

from vidjobs.common.errors import DEFAULT_MESSAGES, ErrorCode, JobError, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import (
    ModelInfo,
    ProviderSignal,
    ProviderState,
    Submission,
    SubmitRequest,
    formats,
)
from vidjobs.providers.checks import invalid, pick_model
from vidjobs.providers.http import INPUT_STATUSES, ErrorTable, HttpAdapter, Refusal, Said, decode, lost, rows

T = TypeVar("T")

API = "/dream-machine/v1"
KEY_SETTING = "VIDJOBS_LUMA_API_KEY"
MODELS = ("ray-2", "ray-flash-2")
PARAMS: dict[str, type] = {"loop": bool}  # documented request fields a job may set through `params`
DURATIONS = {5: "5s", 9: "9s"}
RESOLUTIONS = {"480p": "540p", "720p": "720p", "1080p": "1080p"}
ASPECT_RATIOS = ("16:9", "9:16", "1:1")
# How far back `find` looks for an attempt's generation: a takeover happens within minutes of the crash.
FIND_PAGES, FIND_PAGE_SIZE = 5, 100

# A generation id is a UUID; anything else in a callback is not Luma's.
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
# Luma's words for a request or generation stopped by moderation ("Advanced moderation failed",
# "400: prompt not allowed because advanced moderation failed").
_CONTENT_WORDS = re.compile(r"moderat|not allowed|nsfw|safety|content polic", re.IGNORECASE)
_CREDIT_WORDS = re.compile(r"insufficient credit|out of credit|no credits", re.IGNORECASE)

STATES: dict[str, ProviderState] = {
    "queued": ProviderState.QUEUED,
    "dreaming": ProviderState.RUNNING,
    "completed": ProviderState.SUCCEEDED,
    "failed": ProviderState.FAILED,
}


# --- Luma's wire format, as far as we read it ----------------------------------------------------------


class _Assets(msgspec.Struct, kw_only=True):
    video: str | None = None


class _Request(msgspec.Struct, kw_only=True):
    callback_url: str | None = None


class _Generation(msgspec.Struct, kw_only=True):
    id: str
    state: Literal["queued", "dreaming", "completed", "failed"]
    failure_reason: str | None = None
    assets: _Assets | None = None
    request: _Request | None = None


class _GenerationList(msgspec.Struct, kw_only=True):
    generations: list[_Generation]
    has_more: bool | None = None


class _ErrorAnswer(msgspec.Struct, kw_only=True):
    # A sentence, or (for a request that breaks the schema) a list of {"loc": [...], "msg": "..."}.
    detail: Any = None


class _Frame(msgspec.Struct, kw_only=True):
    type: str
    url: str


class _Keyframes(msgspec.Struct, kw_only=True):
    frame0: _Frame


class _CreateGeneration(msgspec.Struct, kw_only=True, omit_defaults=True):
    generation_type: Literal["video"]
    model: str
    prompt: str
    aspect_ratio: str
    resolution: str
    duration: str
    loop: bool | None = None
    keyframes: _Keyframes | None = None
    callback_url: str | None = None


# --- the adapter ---------------------------------------------------------------------------------------


def _read(status: int, body: bytes) -> Said:
    said = _said(_error_answer(body))
    if status not in (401, 403) and _CREDIT_WORDS.search(said):
        return Said(said, _NO_CREDIT)
    refused = status in INPUT_STATUSES and _CONTENT_WORDS.search(said)
    return Said(said, _CONTENT_REFUSED if refused else None)


_NO_CREDIT = Refusal(ErrorCode.INTERNAL, "Our {title} account is out of credit: {said}")
_CONTENT_REFUSED = Refusal(ErrorCode.CONTENT_REJECTED, "{title} refused the request: {said}")
ERRORS = ErrorTable("Luma", {
    **rows((401, 403), Refusal(ErrorCode.INTERNAL, "{title} refused our API key ({status}: {said}); check the "
                                                   f"{KEY_SETTING} setting.")),
    402: _NO_CREDIT,
    **rows(INPUT_STATUSES, Refusal(ErrorCode.INVALID_INPUT, "{title} refused the request: {said}")),
}, _read)
http_error = ERRORS.error


class LumaAdapter(HttpAdapter):
    name = "luma"
    errors = ERRORS
    supports_callbacks = True

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str):
        super().__init__(session, base_url)
        self._auth = {"Authorization": f"Bearer {api_key}"}

    def auth_headers(self) -> dict[str, str]:
        return self._auth

    def says_missing(self, body: bytes) -> bool:
        return _error_answer(body) is not None

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"luma/{name}", durations_s=sorted(DURATIONS), rounds_up=True,
                          formats=formats(ASPECT_RATIOS, RESOLUTIONS), input_image="optional")
                for name in MODELS]

    def validate(self, request: JobRequest) -> None:
        pick_model(self.name, "Luma", request.model_name, dict.fromkeys(MODELS))
        for name, value in request.params.items():
            kind = PARAMS.get(name)
            if kind is None:
                raise invalid(f"params.{name}: not a parameter of Luma {request.model_name} "
                              f"(it takes: {', '.join(PARAMS)})")
            if not isinstance(value, kind):
                raise invalid(f"params.{name}: must be true or false, not {value!r}")
        _duration(request)
        if request.aspect_ratio not in ASPECT_RATIOS:
            raise invalid(f"aspect_ratio: Luma takes {', '.join(ASPECT_RATIOS)}, not {request.aspect_ratio}")
        if request.resolution not in RESOLUTIONS:
            raise invalid(f"resolution: Luma takes {', '.join(RESOLUTIONS)}, not {request.resolution}")
        if request.negative_prompt:
            raise invalid(f"negative_prompt: Luma {request.model_name} takes no negative prompt; leave it out")
        if request.seed is not None:
            raise invalid(f"seed: Luma {request.model_name} takes no seed; leave it out")

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        body = msgspec.json.encode(_create_body(req))
        raw = await self.call("POST", f"{API}/generations", data=body, headers={"Content-Type": "application/json"})
        generation = _decode(raw, _Generation)
        return Submission(provider_job_id=generation.id, state=STATES[generation.state])

    async def find(self, req: SubmitRequest) -> Submission | None:
        """This attempt's generation among the account's most recent ones, matched by the job id and attempt
        that its callback URL carries."""
        for page in range(FIND_PAGES):
            query = {"limit": str(FIND_PAGE_SIZE), "offset": str(page * FIND_PAGE_SIZE)}
            listed = _decode(await self.call("GET", f"{API}/generations", params=query), _GenerationList)
            for generation in listed.generations:
                if _attempt_of(generation) == (req.job_id, req.attempt):
                    return Submission(provider_job_id=generation.id, state=STATES[generation.state])
            if not listed.has_more or len(listed.generations) < FIND_PAGE_SIZE:
                return None
        return None

    async def status(self, provider_job_id: str) -> ProviderSignal:
        raw = await self.call_known("GET", _generation_path(provider_job_id))
        if raw is None:
            return lost(provider_job_id, "Luma has no record of this generation.")
        generation = _decode(raw, _Generation)
        job_id, attempt = _attempt_of(generation)
        return msgspec.structs.replace(_signal(generation), job_id=job_id, attempt=attempt)

    async def cancel(self, provider_job_id: str) -> None:
        # Luma documents no way to stop a generation, only to delete it; a job that no longer wants its
        # render (canceled, deleted, past its deadline) has no use for the generation either. One already
        # gone is nothing to stop.
        await self.call_known("DELETE", _generation_path(provider_job_id))

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        """Luma signs nothing, so nothing can be verified: a well-formed generation is stored under an id made
        from its generation id, state and a hash of the whole body. Luma's retries of one delivery send the
        same body and are stored once; a forged body never shares a genuine delivery's id, so it cannot crowd
        the genuine one out, and all it can cause is a status poll."""
        try:
            generation = msgspec.json.decode(body, type=_Generation)
        except msgspec.DecodeError as exc:
            raise WebhookRejected(f"the body is not a Luma generation: {exc}") from exc
        if not _UUID.match(generation.id):
            raise WebhookRejected("the body's id is not a Luma generation id")
        return f"{generation.id}:{generation.state}:{hashlib.sha256(body).hexdigest()[:32]}"

    def parse_callback(self, body: bytes) -> ProviderSignal:
        # Unsigned, so the job is looked up by the generation id we recorded ourselves, never by what the
        # body claims, and the signal only prompts a status poll.
        return msgspec.structs.replace(_signal(_decode(body, _Generation)), verified=False)


# --- translation ---------------------------------------------------------------------------------------


def failure(reason: str | None) -> JobError:
    """A failed generation's `failure_reason` in our taxonomy; anything unrecognised counts as a transient
    failure of the render."""
    text = (reason or "").strip()
    if _CONTENT_WORDS.search(text):
        code = ErrorCode.CONTENT_REJECTED
    elif _CREDIT_WORDS.search(text):
        return JobError.of(ErrorCode.INTERNAL, f"Our Luma account is out of credit: {text}")
    elif re.search(r"timed? ?out", text, re.IGNORECASE):
        code = ErrorCode.TIMEOUT
    else:
        code = ErrorCode.PROVIDER_UNAVAILABLE
    detail = f" Luma said: {text[:500]}" if text else ""
    return JobError.of(code, DEFAULT_MESSAGES[code] + detail)


def _signal(generation: _Generation) -> ProviderSignal:
    state = STATES[generation.state]
    video = generation.assets.video if generation.assets else None
    return ProviderSignal(
        provider_job_id=generation.id, state=state,
        output_url=video if state is ProviderState.SUCCEEDED else None,
        error=failure(generation.failure_reason) if state is ProviderState.FAILED else None,
    )


def callback_url_for(req: SubmitRequest) -> str | None:
    """Our callback URL with the job id and attempt in its query, which Luma echoes in every generation."""
    if not req.callback_url:
        return None
    joiner = "&" if urlsplit(req.callback_url).query else "?"
    return req.callback_url + joiner + urlencode({"job": req.job_id, "attempt": req.attempt})


def _attempt_of(generation: _Generation) -> tuple[str | None, int | None]:
    url = generation.request.callback_url if generation.request else None
    query = parse_qs(urlsplit(url).query) if url else {}
    job, attempt = query.get("job", [None])[0], query.get("attempt", [""])[0]
    return job, int(attempt) if attempt.isdigit() else None


def _duration(request: JobRequest) -> str:
    length = next((d for d in DURATIONS if d >= request.duration_s), None)
    if length is None:
        raise invalid(f"duration_s: Luma {request.model_name} makes 5 s or 9 s clips; "
                       f"{request.duration_s} s is longer")
    return DURATIONS[length]


def _create_body(req: SubmitRequest) -> _CreateGeneration:
    r = req.request
    keyframes = None
    if r.input_image is not None:
        if not req.input_image_url:
            raise ProviderError(ErrorCode.INTERNAL, "The input image has no address Luma could fetch.")
        keyframes = _Keyframes(frame0=_Frame(type="image", url=req.input_image_url))
    return _CreateGeneration(
        generation_type="video", model=r.model_name, prompt=r.prompt, aspect_ratio=r.aspect_ratio,
        resolution=RESOLUTIONS[r.resolution], duration=_duration(r), loop=r.params.get("loop"), keyframes=keyframes,
        callback_url=callback_url_for(req),
    )


def _generation_path(provider_job_id: str) -> str:
    return f"{API}/generations/{quote(provider_job_id, safe='')}"


def _decode(raw: bytes, kind: type[T]) -> T:
    return decode(raw, kind, "Luma")


def _error_answer(body: bytes) -> _ErrorAnswer | None:
    try:
        answer = msgspec.json.decode(body, type=_ErrorAnswer)
    except msgspec.DecodeError:
        return None
    return answer if answer.detail is not None else None


def _said(answer: _ErrorAnswer | None) -> str:
    if answer is None:
        return ""
    if isinstance(answer.detail, str):
        return " ".join(answer.detail.split())
    if isinstance(answer.detail, list):  # schema errors: name each field as Luma located it
        parts = []
        for item in answer.detail:
            if isinstance(item, dict):
                where = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{where}: {item.get('msg', '')}" if where else str(item.get("msg", "")))
        return "; ".join(parts)
    return ""
