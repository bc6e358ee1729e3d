"""The adapter for the fake provider: our normalised request in, the provider's answers out as signals and
errors of our taxonomy.

It knows the provider only through its HTTP API (`server.py` documents it), exactly as an adapter for a real
provider would: it decodes answers leniently (new fields are ignored) and maps every failure to one code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from libs.common.errors import DEFAULT_MESSAGES, ErrorCode, JobError, ProviderError
from libs.common.jobs import JobRequest
from libs.providers import webhooks
from libs.providers.base import (
    ALL_RATIOS,
    ALL_RESOLUTIONS,
    ModelInfo,
    ProviderSignal,
    ProviderState,
    Submission,
    SubmitRequest,
    formats,
)
from libs.providers.http import retry_after, transport_errors

SCENARIOS = (
    "succeed", "duplicate_callbacks", "no_callback", "rate_limit_then_succeed", "unavailable_then_succeed",
    "content_rejected", "fail_always", "hang", "bad_output", "expired_output", "unsafe_output",
    "accept_then_timeout", "accept_then_drop",
)
PARAMS = ("scenario", "render_s", "output_mb", "cost_usd", "answer_after_s", "lookup")
MAX_OUTPUT_MB = 2048
MAX_RENDER_S = 600
MAX_COST_USD = 1000

# The provider's own error codes, in a failed render or an error answer, in our taxonomy.
PROVIDER_CODES: dict[str, ErrorCode] = {
    "content_policy_violation": ErrorCode.CONTENT_REJECTED,
    "invalid_request": ErrorCode.INVALID_INPUT,
    "rate_limit_exceeded": ErrorCode.RATE_LIMITED,
    "service_unavailable": ErrorCode.PROVIDER_UNAVAILABLE,
    "render_failed": ErrorCode.PROVIDER_UNAVAILABLE,
    "render_timeout": ErrorCode.TIMEOUT,
}


# --- the provider's wire format, as far as we read it --------------------------------------------------


class _Error(msgspec.Struct):
    code: str
    message: str = ""


class _ErrorAnswer(msgspec.Struct):
    error: _Error


class _Metadata(msgspec.Struct, kw_only=True):
    job_id: str | None = None
    attempt: int | None = None


class _Render(msgspec.Struct, kw_only=True):
    id: str
    status: ProviderState
    progress: float | None = None
    output_url: str | None = None
    error: _Error | None = None
    cost_usd: float | None = None
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)


class _RenderList(msgspec.Struct):
    data: list[_Render]


class _Event(msgspec.Struct):
    type: str
    data: _Render


class _CreateRender(msgspec.Struct, kw_only=True):
    model: str
    prompt: str
    duration_s: float
    aspect_ratio: str
    resolution: str
    seed: int | None
    negative_prompt: str | None
    input_image_url: str | None
    params: dict[str, Any]
    callback_url: str | None
    metadata: _Metadata


# --- the adapter ---------------------------------------------------------------------------------------


class FakeAdapter:
    name = "fake"
    supports_callbacks = True

    def __init__(self, session: aiohttp.ClientSession, base_url: str, webhook_secret: str, *,
                 tolerance_s: float = webhooks.DEFAULT_TOLERANCE_S):
        if webhook_secret:
            webhooks.decode_secret(webhook_secret)  # a malformed secret fails at start, not per callback
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.webhook_secret = webhook_secret
        self.tolerance_s = tolerance_s

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"{self.name}/default", durations_s=list(range(1, 61)),
                          formats=formats(ALL_RATIOS, ALL_RESOLUTIONS), input_image="optional",
                          negative_prompt=True, seed=True)]

    def validate(self, request: JobRequest) -> None:
        for name in request.params:
            if name not in PARAMS:
                raise _invalid(f"params.{name}: not a parameter of the fake provider (it takes {', '.join(PARAMS)})")
        scenario = request.params.get("scenario", "succeed")
        if scenario not in SCENARIOS:
            raise _invalid(f"params.scenario: unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
        render_s = request.params.get("render_s", 3.0)
        if not _is_number(render_s) or not 0 <= render_s <= MAX_RENDER_S:
            raise _invalid(f"params.render_s: must be a number of seconds from 0 to {MAX_RENDER_S}, "
                           f"not {render_s!r}")
        output_mb = request.params.get("output_mb", 0)
        if not isinstance(output_mb, int) or isinstance(output_mb, bool) or not 0 <= output_mb <= MAX_OUTPUT_MB:
            raise _invalid(f"params.output_mb: must be a whole number of megabytes from 0 to {MAX_OUTPUT_MB}")
        cost_usd = request.params.get("cost_usd", 0)
        if not _is_number(cost_usd) or not 0 <= cost_usd <= MAX_COST_USD:
            raise _invalid(f"params.cost_usd: must be a number of USD from 0 to {MAX_COST_USD}, not {cost_usd!r}")
        answer_after_s = request.params.get("answer_after_s", 0)
        if not _is_number(answer_after_s) or not 0 <= answer_after_s <= MAX_RENDER_S:
            raise _invalid(f"params.answer_after_s: must be a number of seconds from 0 to {MAX_RENDER_S}")
        if not isinstance(request.params.get("lookup", True), bool):
            raise _invalid("params.lookup: must be true or false")

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        body = msgspec.json.encode(_create_body(req))
        headers = {"Idempotency-Key": req.idempotency_key, "Content-Type": "application/json"}
        raw = await self._call("POST", "/v1/renders", data=body, headers=headers)
        render = _decode(raw, _Render)
        return Submission(provider_job_id=render.id, state=render.status)

    async def find(self, req: SubmitRequest) -> Submission | None:
        if req.request.params.get("lookup") is False:
            return None  # behaves as a provider that cannot look a render up
        raw = await self._call("GET", "/v1/renders", params={"idempotency_key": req.idempotency_key})
        found = _decode(raw, _RenderList).data
        return Submission(provider_job_id=found[0].id, state=found[0].status) if found else None

    async def status(self, provider_job_id: str) -> ProviderSignal:
        try:
            raw = await self._call("GET", f"/v1/renders/{quote(provider_job_id, safe='')}", tell_missing=True)
        except _Missing:
            # The provider forgot the render (it restarted): it will never finish, so this attempt failed.
            error = JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, "The provider lost track of this render.")
            return ProviderSignal(provider_job_id=provider_job_id, state=ProviderState.FAILED, error=error)
        return _signal(_decode(raw, _Render))

    async def cancel(self, provider_job_id: str) -> None:
        try:
            await self._call("POST", f"/v1/renders/{quote(provider_job_id, safe='')}/cancel", tell_missing=True)
        except _Missing:
            pass  # nothing there to stop

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        return webhooks.verify(self.webhook_secret, headers, body, tolerance_s=self.tolerance_s)

    def parse_callback(self, body: bytes) -> ProviderSignal:
        return _signal(_decode(body, _Event).data)

    def download_headers(self) -> dict[str, str]:
        return {}

    async def close(self) -> None:
        """The session belongs to the caller; nothing of our own to release."""

    async def _call(self, method: str, path: str, *, tell_missing: bool = False, **kwargs: Any) -> bytes:
        """The body of a 2xx answer. Every other outcome is raised as a ProviderError of our taxonomy
        (or `_Missing` for a 404, with `tell_missing`, when the caller has a meaning for it)."""
        async with transport_errors("The provider", method, path):
            async with self.session.request(method, self.base_url + path, **kwargs) as resp:
                raw = await resp.read()
                if resp.status < 300:
                    return raw
                if resp.status == 404 and tell_missing and _is_not_found(raw):
                    raise _Missing
                raise http_error(resp.status, raw, resp.headers)


class _Missing(Exception):
    """A 404 the caller turns into a meaning of its own."""


# --- translation ---------------------------------------------------------------------------------------


def http_error(status: int, body: bytes, headers: Mapping[str, str]) -> ProviderError:
    """An error answer in our taxonomy, carrying the provider's own words where it gave any."""
    given = _error_answer(body)
    said = given.message if given and given.message else f"HTTP {status}"
    if status == 429:
        return ProviderError(ErrorCode.RATE_LIMITED, f"The provider is rate limiting us: {said}",
                             retry_after=retry_after(headers.get("Retry-After")))
    if status >= 500:
        return ProviderError(ErrorCode.PROVIDER_UNAVAILABLE, f"The provider is unavailable: {said}")
    if status == 408:
        return ProviderError(ErrorCode.TIMEOUT, f"The provider timed out: {said}")
    if given is not None and given.code in PROVIDER_CODES:
        return ProviderError(PROVIDER_CODES[given.code], said)
    if status in (400, 409, 413, 415, 422):
        return ProviderError(ErrorCode.INVALID_INPUT, said)
    # 401, 403, an unexpected 404: our configuration is wrong, not the job.
    return ProviderError(ErrorCode.INTERNAL, f"The provider refused our call ({status}): {said}")


def render_error(error: _Error | None) -> JobError:
    """A failed render's error in our taxonomy; an unknown provider code counts as a transient failure."""
    if error is None:
        return JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, "The provider failed the render without saying why.")
    code = PROVIDER_CODES.get(error.code, ErrorCode.PROVIDER_UNAVAILABLE)
    detail = f" The provider said: {error.message}" if error.message else ""
    return JobError.of(code, DEFAULT_MESSAGES[code] + detail)


def _signal(render: _Render) -> ProviderSignal:
    failed = render.status is ProviderState.FAILED
    return ProviderSignal(
        provider_job_id=render.id, state=render.status, job_id=render.metadata.job_id,
        attempt=render.metadata.attempt, progress=render.progress, output_url=render.output_url,
        error=render_error(render.error) if failed else None, cost=render.cost_usd,
    )


def _create_body(req: SubmitRequest) -> _CreateRender:
    r = req.request
    return _CreateRender(
        model=r.model_name, prompt=r.prompt, duration_s=r.duration_s, aspect_ratio=r.aspect_ratio,
        resolution=r.resolution, seed=r.seed, negative_prompt=r.negative_prompt,
        input_image_url=req.input_image_url, params=r.params, callback_url=req.callback_url,
        metadata=_Metadata(job_id=req.job_id, attempt=req.attempt),
    )


def _decode(raw: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
        raise ProviderError(ErrorCode.INTERNAL, f"The provider sent a malformed {kind.__name__.strip('_').lower()}: "
                                                f"{exc}") from exc


def _error_answer(body: bytes) -> _Error | None:
    try:
        return msgspec.json.decode(body, type=_ErrorAnswer).error
    except msgspec.DecodeError:
        return None


def _is_not_found(body: bytes) -> bool:
    """The provider's own "no such render", not a 404 from some other server at a wrong address."""
    given = _error_answer(body)
    return given is not None and given.code == "not_found"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _invalid(message: str) -> ProviderError:
    return ProviderError(ErrorCode.INVALID_INPUT, message)


class PollingFakeAdapter(FakeAdapter):
    """The fake provider reached without callbacks (`fake-poll/<model>`): it behaves like a provider that only
    answers status polls, so the tapered polling path runs for real."""

    name = "fake-poll"
    supports_callbacks = False
