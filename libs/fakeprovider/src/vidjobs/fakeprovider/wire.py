"""What the fake provider's clients send and get back: requests, renders, callbacks, counters and errors.

Errors are answered as `{"error": {"code", "message", "param"}}`; `ApiFailure` carries one from wherever the
provider refuses something to the HTTP layer that answers it.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Literal

import msgspec


class Scenario(enum.StrEnum):
    SUCCEED = "succeed"
    DUPLICATE_CALLBACKS = "duplicate_callbacks"
    NO_CALLBACK = "no_callback"
    # Calls back when the render starts, never when it ends: a finishing callback lost on its way to us.
    NO_FINAL_CALLBACK = "no_final_callback"
    RATE_LIMIT_THEN_SUCCEED = "rate_limit_then_succeed"
    UNAVAILABLE_THEN_SUCCEED = "unavailable_then_succeed"
    CONTENT_REJECTED = "content_rejected"
    FAIL_ALWAYS = "fail_always"
    HANG = "hang"
    BAD_OUTPUT = "bad_output"
    EXPIRED_OUTPUT = "expired_output"
    UNSAFE_OUTPUT = "unsafe_output"
    # The first submit of a key is accepted, but its answer is lost: it comes after the caller's timeout
    # (`params.answer_after_s`), or the connection is closed without one. Replays of the key answer at once.
    ACCEPT_THEN_TIMEOUT = "accept_then_timeout"
    ACCEPT_THEN_DROP = "accept_then_drop"
    # The first `params.failures` renders of a job (by metadata.job_id) fail with a transient error after
    # rendering; the next one succeeds.
    FAIL_THEN_SUCCEED = "fail_then_succeed"
    # Our account with the provider refuses us, whatever the request: every submit answered 402 (out of
    # credit) or 401 (the key refused); or the submit accepted and every later call about its render (status,
    # cancel, a look-up) answered 401, as if the key were revoked meanwhile.
    NO_CREDIT = "no_credit"
    KEY_REFUSED = "key_refused"
    KEY_REVOKED = "key_revoked"


class RenderStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


FINISHED = frozenset({RenderStatus.SUCCEEDED, RenderStatus.FAILED, RenderStatus.CANCELED})

USD_PER_SECOND = 0.10  # the fake's list price per second of video


class RenderParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scenario: Scenario = Scenario.SUCCEED
    render_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 3.0
    output_mb: Annotated[int, msgspec.Meta(ge=0, le=2048)] = 0
    # What a finished render is billed, reported with it; by default USD_PER_SECOND of video.
    cost_usd: Annotated[float, msgspec.Meta(ge=0, le=1000)] | None = None
    # What a render that failed after it started is billed (a partial render), reported with the failure; by
    # default nothing. A render refused before it started (content_rejected, a bad input image) is never billed.
    failed_cost_usd: Annotated[float, msgspec.Meta(ge=0, le=1000)] | None = None
    # fail_then_succeed: how many of the job's renders fail before one succeeds.
    failures: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2
    # accept_then_timeout: how long the accepted submit's answer is held back.
    answer_after_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 45.0
    # False: the adapter cannot look renders up (as at providers without a list or key lookup).
    lookup: bool = True
    # "tiny" or "real" (clips.ClipKind): which kind of clip this render makes; by default the provider's own.
    clip: Literal["tiny", "real"] | None = None
    # The output is served at this many kilobytes (1000 bytes) a second, as from a slow provider's storage.
    serve_kb_per_s: Annotated[float, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    # The output stops flowing after this many megabytes, the connection left open: a stalled download.
    serve_stall_after_mb: Annotated[float, msgspec.Meta(ge=0, le=2048)] | None = None


class Metadata(msgspec.Struct, kw_only=True):
    """Echoed back on every read and callback, so the caller can find its own job."""

    job_id: str | None = None
    attempt: int | None = None


class CreateRender(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    duration_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0
    aspect_ratio: Literal["16:9", "9:16", "1:1"] = "16:9"
    resolution: Literal["480p", "720p", "1080p"] = "720p"
    seed: int | None = None
    negative_prompt: str | None = None
    input_image_url: str | None = None
    params: RenderParams = msgspec.field(default_factory=RenderParams)
    callback_url: str | None = None
    metadata: Metadata = msgspec.field(default_factory=Metadata)


def billed(req: CreateRender) -> float:
    given = req.params.cost_usd
    return round(req.duration_s * USD_PER_SECOND, 4) if given is None else given


def billed_as(req: CreateRender, status: RenderStatus, started: bool) -> float | None:
    """What a render reports it was billed as it now stands: a finished render its price, a failed one that had
    started its `failed_cost_usd`; nothing otherwise."""
    if status is RenderStatus.SUCCEEDED:
        return billed(req)
    if status is RenderStatus.FAILED and started:
        return req.params.failed_cost_usd
    return None


class RenderError(msgspec.Struct):
    code: str  # content_policy_violation | render_failed | invalid_request
    message: str


class RenderOut(msgspec.Struct, kw_only=True):
    id: str
    object: str = "render"
    model: str
    status: RenderStatus
    progress: float
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float
    width: int
    height: int
    seed: int
    output_url: str | None
    error: RenderError | None
    cost_usd: float | None  # what the render was billed: once it succeeded, or failed after it started
    metadata: Metadata
    idempotency_key: str | None


class RenderList(msgspec.Struct):
    data: list[RenderOut]


class CallbackEvent(msgspec.Struct):
    type: str  # render.running | render.succeeded | render.failed | render.canceled
    timestamp: datetime
    data: RenderOut


class FetchedImage(msgspec.Struct, kw_only=True):
    """An input image as the provider fetched and decoded it."""

    render_id: str
    sha256: str
    bytes: int
    format: str
    width: int
    height: int


class Counters(msgspec.Struct, kw_only=True):
    submissions_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # every POST, by metadata.job_id
    submissions_by_key: dict[str, int] = msgspec.field(default_factory=dict)  # every POST, by Idempotency-Key
    refusals_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # submits a scenario refused
    renders_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # renders created (each runs once)
    renders_by_attempt: dict[str, int] = msgspec.field(default_factory=dict)  # by "<job_id>/<attempt>"
    lost_answers_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # accept_then_timeout / _drop
    output_fetches: dict[str, int] = msgspec.field(default_factory=dict)  # GETs of an output, by render id
    callbacks_by_render: dict[str, int] = msgspec.field(default_factory=dict)  # deliveries answered 2xx
    input_images: dict[str, FetchedImage] = msgspec.field(default_factory=dict)  # by job (or render) id


def bump(counter: dict[str, int], key: str | None) -> None:
    if key is not None:
        counter[key] = counter.get(key, 0) + 1


class ApiFailure(Exception):
    """Answered as the provider's JSON error; raised from handlers and from the provider's own logic."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"code": self.code, "message": self.message, "param": self.param}}


_HINTS = {
    "params.scenario": "one of " + ", ".join(Scenario),
    "params.render_s": "seconds from 0 to 600",
    "params.cost_usd": "USD from 0 to 1000",
    "params.failed_cost_usd": "USD from 0 to 1000",
    "params.failures": "a whole number from 0 to 10",
}


def decode_render(raw: bytes) -> CreateRender:
    """A render request from its JSON body; ApiFailure naming the field that is wrong otherwise."""
    try:
        return msgspec.json.decode(raw, type=CreateRender)
    except msgspec.ValidationError as exc:
        # msgspec says "Expected `float` >= 0.0 - at `$.params.render_s`"; lead with the field's name.
        text, _, where = str(exc).partition(" - at `$.")
        param = where.rstrip("`") or None
        if param in _HINTS:
            text = f"{text}; {_HINTS[param]}"
        raise ApiFailure(422, "invalid_request", f"{param}: {text}" if param else text, param=param) from exc
    except msgspec.DecodeError as exc:
        raise ApiFailure(400, "invalid_request", f"The body is not valid JSON: {exc}") from exc
