"""The one narrow protocol every provider adapter implements.

Adapters never touch the database. They translate our normalised request into the provider's, and the
provider's answers, callbacks and errors into `ProviderSignal`s and `ProviderError`s of our taxonomy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import msgspec

from libs.common.errors import JobError
from libs.common.jobs import JobRequest


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


@runtime_checkable
class ProviderAdapter(Protocol):
    name: str
    supports_callbacks: bool

    def validate(self, request: JobRequest) -> None:
        """Raise ProviderError(INVALID_INPUT) naming the field if this provider cannot take the request."""

    async def submit(self, req: SubmitRequest) -> Submission:
        """Start a render. Raises ProviderError with the taxonomy code (and Retry-After) on failure."""

    async def find(self, req: SubmitRequest) -> Submission | None:
        """The provider's job for this attempt if it already exists (looked up before any resubmit)."""

    async def status(self, provider_job_id: str) -> ProviderSignal:
        """Ask the provider where a job stands."""

    async def cancel(self, provider_job_id: str) -> None:
        """Ask the provider to stop; a provider that cannot cancel does nothing."""

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        """Check a callback's signature and freshness; return its unique delivery id.

        Raises WebhookRejected when it cannot be trusted."""

    def parse_callback(self, body: bytes) -> ProviderSignal:
        """Turn a stored, verified callback body into a signal. Raises ProviderError(INTERNAL) if malformed."""

    def download_headers(self) -> dict[str, str]:
        """Headers needed to fetch an output URL (most providers need none)."""

    async def close(self) -> None: ...
