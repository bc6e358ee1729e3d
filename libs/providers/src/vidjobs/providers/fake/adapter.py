"""The adapter for the fake provider: our normalised request in, the provider's answers out as signals and
errors of our taxonomy.

It knows the provider only through its HTTP API (`server.py` documents it), exactly as an adapter for a real
provider would: it decodes answers leniently (new fields are ignored) and maps every failure to one code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from vidjobs.common import signatures
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import base, checks, http
from vidjobs.providers.base import ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest
from vidjobs.providers.http import ErrorTable, HttpAdapter, Refusal, Said, SignedCallbacks

SCENARIOS = (
    "succeed", "duplicate_callbacks", "no_callback", "no_final_callback", "rate_limit_then_succeed",
    "unavailable_then_succeed", "content_rejected", "fail_always", "hang", "bad_output", "expired_output",
    "unsafe_output", "accept_then_timeout", "accept_then_drop", "fail_then_succeed", "no_credit", "key_refused",
    "key_revoked",
)
MAX_RENDER_S = 600

# What each `params` entry a job may set must be.
PARAM_CHECKS: dict[str, checks.Check] = {
    "scenario": lambda value: None if value in SCENARIOS else f"unknown scenario; one of {', '.join(SCENARIOS)}",
    "render_s": checks.number(0, MAX_RENDER_S, "seconds"),
    "output_mb": checks.number(0, 2048, "megabytes", whole=True),
    "cost_usd": checks.number(0, 1000, "USD"),
    "failed_cost_usd": checks.number(0, 1000, "USD"),
    "failures": checks.number(0, 10, "failures", whole=True),
    "answer_after_s": checks.number(0, MAX_RENDER_S, "seconds"),
    "lookup": checks.boolean,
    "clip": checks.one_of("tiny", "real"),
    "serve_kb_per_s": checks.number(1, 10_000_000, "kilobytes a second"),
    "serve_stall_after_mb": checks.number(0, 2048, "megabytes"),
}

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


def _read(status: int, body: bytes) -> Said:
    given = _error_answer(body)
    code = PROVIDER_CODES.get(given.code) if given else None
    return Said(given.message if given else "", Refusal(code, "{said}") if code else None)


# 401, 403, an unexpected 404 fall to the table's last row (our configuration is wrong, not the job), 402 to our
# account out of credit.
ERRORS = ErrorTable("The provider", http.rows(http.INPUT_STATUSES, Refusal(ErrorCode.INVALID_INPUT, "{said}")), _read)
http_error = ERRORS.error


class FakeAdapter(SignedCallbacks, HttpAdapter):
    name = "fake"
    errors = ERRORS
    supports_callbacks = True
    key_header = None  # the fake provider takes no key
    forgotten = "The provider lost track of this render."  # it restarted

    def __init__(self, session: aiohttp.ClientSession, base_url: str, webhook_secret: str, *,
                 tolerance_s: float = signatures.DEFAULT_TOLERANCE_S):
        SignedCallbacks.__init__(self, webhook_secret, tolerance_s)
        HttpAdapter.__init__(self, session, base_url)

    def says_missing(self, body: bytes) -> bool:
        """The provider's own "no such render", not a 404 from some other server at a wrong address."""
        given = _error_answer(body)
        return given is not None and given.code == "not_found"

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"{self.name}/default", durations_s=list(range(1, 61)),
                          formats=base.formats(base.ALL_RATIOS, base.ALL_RESOLUTIONS), input_image="optional",
                          negative_prompt=True, seed=True)]

    def validate(self, request: JobRequest) -> None:
        checks.check_params("the fake provider", request.params, PARAM_CHECKS)

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        raw = await self.send("/v1/renders", _create_body(req), {"Idempotency-Key": req.idempotency_key})
        render = self.read(raw, _Render, "render")
        return Submission(provider_job_id=render.id, state=render.status)

    async def find(self, req: SubmitRequest) -> Submission | None:
        if req.request.params.get("lookup") is False:
            return None  # behaves as a provider that cannot look a render up
        raw = await self.call("GET", "/v1/renders", params={"idempotency_key": req.idempotency_key})
        found = self.read(raw, _RenderList, "render list").data
        return Submission(provider_job_id=found[0].id, state=found[0].status) if found else None

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        return await self.poll(f"/v1/renders/{quote(provider_job_id, safe='')}", provider_job_id,
                               lambda raw: _signal(self.read(raw, _Render, "render")))

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        # A render the provider no longer has is nothing to stop.
        await self.call_known("POST", f"/v1/renders/{quote(provider_job_id, safe='')}/cancel")

    def parse_callback(self, body: bytes) -> ProviderSignal:
        return _signal(self.read(body, _Event, "event").data)


# --- translation ---------------------------------------------------------------------------------------


def render_error(error: _Error | None) -> JobError:
    """A failed render's error in our taxonomy; an unknown provider code counts as a transient failure."""
    if error is None:
        return JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, "The provider failed the render without saying why.")
    code = PROVIDER_CODES.get(error.code, ErrorCode.PROVIDER_UNAVAILABLE)
    return http.said_error(code, "The provider", error.message)


def _signal(render: _Render) -> ProviderSignal:
    failed = render.status is ProviderState.FAILED
    return ProviderSignal(provider_job_id=render.id, state=render.status, job_id=render.metadata.job_id,
                          attempt=render.metadata.attempt, progress=render.progress, output_url=render.output_url,
                          error=render_error(render.error) if failed else None, cost=render.cost_usd)


def _create_body(req: SubmitRequest) -> _CreateRender:
    r = req.request
    return _CreateRender(model=r.model_name, prompt=r.prompt, duration_s=r.duration_s, aspect_ratio=r.aspect_ratio,
                         resolution=r.resolution, seed=r.seed, negative_prompt=r.negative_prompt,
                         input_image_url=req.input_image_url, params=r.params, callback_url=req.callback_url,
                         metadata=_Metadata(job_id=req.job_id, attempt=req.attempt))


def _error_answer(body: bytes) -> _Error | None:
    answer = http.read_or_none(body, _ErrorAnswer)
    return answer.error if answer else None


class PollingFakeAdapter(FakeAdapter):
    """The fake provider reached without callbacks (`fake-poll/<model>`): it behaves like a provider that only
    answers status polls, so the tapered polling path runs for real."""

    name = "fake-poll"
    supports_callbacks = False
