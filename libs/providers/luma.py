"""The adapter for Luma's Dream Machine API: generations created, polled and deleted, with unsigned callbacks
that only prompt a poll. docs/PROVIDERS.md has the routes, fields and states it reads."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import msgspec

from vidjobs.common.errors import ErrorCode, JobError, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, http
from vidjobs.providers.base import ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest, formats
from vidjobs.providers.http import ErrorTable, HttpAdapter, Said, decode, lost, refusals

T = TypeVar("T")

API = "/dream-machine/v1"
KEY_SETTING = "VIDJOBS_LUMA_API_KEY"
MODELS = ("ray-2", "ray-flash-2")
PARAMS = {"loop": checks.boolean}  # documented request fields a job may set through `params`
DURATIONS = {5: "5s", 9: "9s"}
RESOLUTIONS = {"480p": "540p", "720p": "720p", "1080p": "1080p"}
ASPECT_RATIOS = ("16:9", "9:16", "1:1")
FRAMES = [(ratio, resolution) for ratio in ASPECT_RATIOS for resolution in RESOLUTIONS]
# How far back `find` looks for an attempt's generation: a takeover happens within minutes of the crash.
FIND_PAGES, FIND_PAGE_SIZE = 5, 100

# A generation id is a UUID; anything else in a callback is not Luma's.
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
# Luma's words for a request or generation stopped by moderation ("Advanced moderation failed",
# "400: prompt not allowed because advanced moderation failed").
_CONTENT_WORDS = re.compile(r"moderat|not allowed|nsfw|safety|content polic", re.IGNORECASE)
_CREDIT_WORDS = re.compile(r"insufficient credit|out of credit|no credits", re.IGNORECASE)

STATES = {"queued": ProviderState.QUEUED, "dreaming": ProviderState.RUNNING, "completed": ProviderState.SUCCEEDED,
          "failed": ProviderState.FAILED}


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


class _CreateGeneration(msgspec.Struct, kw_only=True, omit_defaults=True):
    generation_type: Literal["video"]
    model: str
    prompt: str
    aspect_ratio: str
    resolution: str
    duration: str
    loop: bool | None = None
    keyframes: dict[str, _Frame] | None = None  # frame0: the first frame
    callback_url: str | None = None


# --- the adapter ---------------------------------------------------------------------------------------


def _read(status: int, body: bytes) -> Said:
    said = _said(_error_answer(body))
    if status not in (401, 403) and _CREDIT_WORDS.search(said):
        return Said(said, http.NO_CREDIT)
    refused = status in http.INPUT_STATUSES and _CONTENT_WORDS.search(said)
    return Said(said, http.CONTENT_REFUSED if refused else None)


ERRORS = ErrorTable("Luma", {**refusals(KEY_SETTING), 402: http.NO_CREDIT}, _read)
http_error = ERRORS.error


class LumaAdapter(HttpAdapter):
    name = "luma"
    errors = ERRORS
    supports_callbacks = True

    def says_missing(self, body: bytes) -> bool:
        return _error_answer(body) is not None

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"luma/{name}", durations_s=sorted(DURATIONS), rounds_up=True,
                          formats=formats(ASPECT_RATIOS, RESOLUTIONS), input_image="optional")
                for name in MODELS]

    def validate(self, request: JobRequest) -> None:
        checks.pick_model(self.name, "Luma", request.model_name, dict.fromkeys(MODELS))
        checks.check_params(f"luma/{request.model_name}", request.params, PARAMS)
        _duration(request)
        checks.check_frame(f"luma/{request.model_name}", FRAMES, request)
        checks.check_optional(f"luma/{request.model_name}", request)

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        raw = await self.send(f"{API}/generations", _create_body(req))
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
    return http.said_error(code, "Luma", text)


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
    return DURATIONS[checks.round_up(f"luma/{request.model_name}", DURATIONS, request)]


def _create_body(req: SubmitRequest) -> _CreateGeneration:
    r = req.request
    keyframes = None
    if r.input_image is not None:
        if not req.input_image_url:
            raise ProviderError(ErrorCode.INTERNAL, "The input image has no address Luma could fetch.")
        keyframes = {"frame0": _Frame(type="image", url=req.input_image_url)}
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
    answer = http.read_or_none(body, _ErrorAnswer)
    return answer if answer is not None and answer.detail is not None else None


def _said(answer: _ErrorAnswer | None) -> str:
    return http.detail_text(answer.detail) if answer is not None else ""
