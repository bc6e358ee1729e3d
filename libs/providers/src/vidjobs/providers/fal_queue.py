"""fal.ai's queue API on the wire, whatever the model: the bodies it answers (queued, status, result, webhook,
error) and how each reads as a signal or an error of our taxonomy. No calls are made here; `fal.py` makes them.
docs/PROVIDERS.md has the routes and bodies."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import msgspec

from vidjobs.common.errors import ErrorCode, JobError, ProviderError
from vidjobs.providers import http
from vidjobs.providers.base import ProviderSignal, ProviderState
from vidjobs.providers.http import Answer, Refusal, Said, decode

T = TypeVar("T")
NAME = "fal"
_MAX_SAID = 300  # characters of fal's own words carried into a job's error message

# fal's model error types that say fal (or a service behind it) failed, not the input.
_SERVER_TYPES = {"internal_server_error", "generation_timeout", "downstream_service_error",
                 "downstream_service_unavailable"}
_CONTENT_WORDS = ("content_policy", "content policy", "flagged by a content checker", "nsfw")
_INPUT_WORDS = ("validation", "invalid input", "status code: 422", "status code: 400")

# A request id as fal hands it out (a UUID): it becomes our stored provider job id and a segment of every URL
# about the request, so it is bounded, and one segment (no slash, no whitespace).
RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[^/\s]+$")]


class Queued(msgspec.Struct, kw_only=True):
    request_id: RequestId
    queue_position: int | None = None


class Status(msgspec.Struct, kw_only=True):
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


class ErrorBody(msgspec.Struct, kw_only=True):
    detail: str | list[_DetailItem] | None = None
    error_type: str | None = None


class _Webhook(msgspec.Struct, kw_only=True):
    request_id: RequestId
    status: str
    payload: Any = None
    error: str | None = None
    payload_error: str | None = None


def request_path(app: str, request_id: str, tail: str = "") -> str:
    """A queued request's URL path under its model's app (`/status`, `/cancel`; "" for the result)."""
    return f"/{quote(app)}/requests/{quote(request_id, safe='')}{tail}"


def read_error(status: int, raw: bytes) -> Said:
    """An error answer's words; for a 400 or 422 also whether fal refused the input for its content or shape."""
    body = http.read_or_none(raw, ErrorBody)
    said = _said(body) or ""
    if status not in (400, 422):
        return Said(said)
    # fal judged the input at the door; its words say whether for its content or its shape.
    code = failure(said or f"HTTP {status}", body, refused=True).code
    return Said(said, Refusal(code, "{title} refused the request: {said}"))


def waiting(request_id: str, st: Status) -> ProviderSignal | None:
    """A status answer as a signal, or None for a completed request whose result must be fetched."""
    match st.status:
        case "IN_QUEUE":
            return ProviderSignal(provider_job_id=request_id, state=ProviderState.QUEUED,
                                  queue_position=st.queue_position)
        case "IN_PROGRESS":
            return ProviderSignal(provider_job_id=request_id, state=ProviderState.RUNNING)
        case "COMPLETED" if st.error or st.error_type:
            body = ErrorBody(detail=st.error, error_type=st.error_type)
            return ProviderSignal(provider_job_id=request_id, state=ProviderState.FAILED,
                                  error=failure(st.error, body))
        case "COMPLETED":
            return None
    raise ProviderError(ErrorCode.INTERNAL, f"fal reported an unknown request status {st.status[:32]!r}")


def read_result(request_id: str, answer: Answer) -> ProviderSignal | None:
    """A result fetch as a signal: the video, or the request's own failure; None when the fetch itself failed
    (our key, our pace, fal being down), which the caller raises as an error answer."""
    if answer.ok:
        payload = decode(answer.body, Any, NAME, "result")
        return ProviderSignal(provider_job_id=request_id, state=ProviderState.SUCCEEDED,
                              output_url=_video_url(payload))
    body = http.read_or_none(answer.body, ErrorBody)
    if not _render_failed(answer, body):
        return None
    error = failure(_said(body) or f"HTTP {answer.status}", body, refused=answer.status in (400, 422))
    return ProviderSignal(provider_job_id=request_id, state=ProviderState.FAILED, error=error)


def read_webhook(body: bytes) -> ProviderSignal:
    """A stored webhook body as a signal; ProviderError(INTERNAL) when it is not fal's."""
    hook = decode(body, _Webhook, NAME, "webhook")
    match hook.status:
        case "OK":
            url = _video_url(hook.payload)
            # No usable payload (fal could not serialise it): the webhook only says where to look.
            return ProviderSignal(provider_job_id=hook.request_id, state=ProviderState.SUCCEEDED,
                                  output_url=url, verified=url is not None)
        case "ERROR":
            error = failure(hook.error, _convert(hook.payload, ErrorBody))
            return ProviderSignal(provider_job_id=hook.request_id, state=ProviderState.FAILED, error=error)
    raise ProviderError(ErrorCode.INTERNAL, f"fal sent a webhook with an unknown status {hook.status[:32]!r}")


def failure(said: str | None, body: ErrorBody | None, *, refused: bool = False) -> JobError:
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


def _render_failed(answer: Answer, body: ErrorBody | None) -> bool:
    """A result fetch answered with the request's own failure (kept with the result), rather than a failure of
    the fetch itself (our key, our pace, fal being down)."""
    if answer.status in (401, 403, 408, 429):
        return False
    if answer.status == 422 or "X-Fal-Error-Type" in answer.headers:
        return True
    return body is not None and (isinstance(body.detail, list) or body.error_type is not None)


def _said(body: ErrorBody | None) -> str | None:
    if body is None:
        return None
    if not body.detail:
        return body.error_type
    if isinstance(body.detail, str):
        return body.detail
    first = body.detail[0]
    where = ".".join(str(part) for part in first.loc if part != "body")
    return f"{where}: {first.msg}" if where else first.msg


def _video_url(payload: Any) -> str | None:
    video = output.video if (output := _convert(payload, _Output)) is not None else None
    return video.url if video is not None and video.url else None


def _convert(payload: Any, kind: type[T]) -> T | None:
    """A webhook's or result's JSON object as `kind`; None for anything else (fal's payloads vary by model)."""
    try:
        return msgspec.convert(payload, kind) if isinstance(payload, dict) else None
    except msgspec.ValidationError:
        return None
