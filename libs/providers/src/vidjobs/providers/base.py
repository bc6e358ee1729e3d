"""The one narrow protocol every provider adapter implements.

Adapters never touch the database. They translate our normalised request into the provider's, and the
provider's answers, callbacks and errors into `ProviderSignal`s and `ProviderError`s of our taxonomy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Literal, Protocol, runtime_checkable

import msgspec

from vidjobs.common.errors import JobError
from vidjobs.common.jobs import JobRequest


class ProviderState(enum.StrEnum):
    QUEUED = "queued"  # accepted, waiting at the provider
    RUNNING = "running"  # rendering; `progress` may say how far
    SUCCEEDED = "succeeded"  # finished; `output_url` points at the render
    FAILED = "failed"  # finished without a render; `error` says why
    CANCELED = "canceled"  # stopped at the provider


class SubmitRequest(msgspec.Struct, kw_only=True):
    job_id: str
    attempt: int
    # Derived from job and attempt: a provider that honours it never renders one attempt twice.
    idempotency_key: str
    request: JobRequest
    callback_url: str | None = None
    input_image_url: str | None = None


class Submission(msgspec.Struct, kw_only=True):
    provider_job_id: str
    state: ProviderState = ProviderState.QUEUED
    queue_position: int | None = None


class ProviderSignal(msgspec.Struct, kw_only=True):
    """Everything a provider told us about one of its jobs, from a callback or a status poll."""

    provider_job_id: str
    state: ProviderState
    job_id: str | None = None  # our job id where the provider echoes it back
    attempt: int | None = None
    progress: float | None = None  # 0..1, only as the provider reported it
    queue_position: int | None = None
    output_url: str | None = None
    error: JobError | None = None
    cost: float | None = None  # USD the provider reported billing for this render, where it says
    # False for a callback nobody signed (Luma): it only says where to look, so the poller asks the
    # provider for the job's status before acting on it.
    verified: bool = True


ALL_RATIOS = ("16:9", "9:16", "1:1")
ALL_RESOLUTIONS = ("480p", "720p", "1080p")


class Format(msgspec.Struct, frozen=True):
    aspect_ratio: str  # 16:9, 9:16 or 1:1
    resolution: str  # 480p, 720p or 1080p
    durations_s: list[int] | None = None  # the lengths it renders in this format, where fewer than the model's


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a model takes, as `GET /v1/models` lists it; the adapter's own tables are the source."""

    id: str  # `<provider>/<model>`, as a job's `model`
    durations_s: list[int]  # the clip lengths it renders
    rounds_up: bool = False  # a shorter length than the longest is rendered as the next length listed
    formats: list[Format]  # the (aspect ratio, resolution) pairs it renders
    formats_with_image: list[Format] | None = None  # the pairs it renders from an input image, where they differ
    input_image: Literal["none", "optional", "required"] = "none"
    negative_prompt: bool = False
    seed: bool = False


def formats(ratios: Iterable[str], resolutions: Iterable[str]) -> list[Format]:
    """Every pairing of `ratios` with `resolutions`, for a model that takes any of each."""
    return [Format(r, res) for r in ratios for res in resolutions]


@runtime_checkable
class ProviderAdapter(Protocol):
    # Read-only: an adapter names itself once, for its class (HttpAdapter.name is a class variable).
    @property
    def name(self) -> str:
        """The provider's name: the part of a job's model before the slash."""

    supports_callbacks: bool

    def validate(self, request: JobRequest) -> None:
        """Raise ProviderError(INVALID_INPUT) naming the field if this provider cannot take the request."""

    def models(self) -> list[ModelInfo]:
        """The models this adapter renders with, and what each takes."""

    async def submit(self, req: SubmitRequest) -> Submission:
        """Start a render. Raises ProviderError with the taxonomy code (and Retry-After) on failure."""

    async def find(self, req: SubmitRequest) -> Submission | None:
        """The provider's job for this attempt if it already exists (looked up before any resubmit)."""

    # `model_name`: the job's model without the provider prefix (`JobRequest.model_name`), for a provider whose
    # render ids do not say where the render lives (fal files each request under its model's app); None when
    # the caller does not know it. Adapters that need no more than the id take it and ignore it.

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        """Ask the provider where a job stands."""

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        """Ask the provider to stop; a provider that cannot cancel does nothing."""

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        """Check a callback's signature and freshness; return its unique delivery id.

        Raises WebhookRejected when it cannot be trusted."""

    def parse_callback(self, body: bytes) -> ProviderSignal:
        """Turn a stored, verified callback body into a signal. Raises ProviderError(INTERNAL) if malformed."""

    def download_headers(self) -> dict[str, str]:
        """Headers needed to fetch an output URL (most providers need none)."""

    async def close(self) -> None: ...
