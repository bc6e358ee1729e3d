"""A stored job as the API shows it: its stage, queue position and signed URLs made at read time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import cast

import asyncpg

from vidjobs.common import expiry
from vidjobs.common.estimates import Estimate
from vidjobs.common.jobs import JobRow
from vidjobs.common.render_estimates import ReadyRange
from vidjobs.common.renders import Outputs, StoredFile
from vidjobs.common.retry import RetryPolicy
from vidjobs.common.settings import Settings
from vidjobs.common.states import RENDERING, JobStatus, Stage, stage_after
from vidjobs.gateway.bodies import (
    Cost,
    JobOut,
    JobOutputs,
    JobUrls,
    Priority,
    QueueEstimate,
    ReadyEstimate,
    RetryOut,
    TransitionOut,
)
from vidjobs.storage.base import Storage


class Unmeasured(ValueError):
    """A stored video without its probed length or size, which the media service always records with it."""


def _measured(video: StoredFile) -> tuple[float, int, int]:
    if video.duration_s is None or video.width is None or video.height is None:
        raise Unmeasured(f"stored video {video.key} has no probed length or size")
    return video.duration_s, video.width, video.height


def _retained_until(job: JobRow, settings: Settings) -> datetime | None:
    """When the original is removed (None while it is kept), or (expired) when it was."""
    if job.status is not JobStatus.COMPLETED:
        return job.updated_at.astimezone(UTC)  # expiry is its last move
    until = expiry.removal_at(job, settings, datetime.now(UTC))
    return None if until is None else until.astimezone(UTC)


def _outputs(job: JobRow, outputs: Outputs, storage: Storage, settings: Settings) -> JobOutputs:
    # An expired job keeps its thumbnail and its facts; the video and its preview are gone.
    live = job.status is JobStatus.COMPLETED
    video, thumbnail, preview = outputs.video, outputs.thumbnail, outputs.preview
    duration_s, width, height = _measured(video)
    ttl_s = settings.signed_url_ttl_s
    thumbnail_url, expires = storage.signed_url(thumbnail.key, ttl_s)
    video_url = storage.signed_url(video.key, ttl_s)[0] if live else None
    preview_url = storage.signed_url(preview.key, ttl_s)[0] if live and preview else None
    return JobOutputs(
        video_url=video_url, thumbnail_url=thumbnail_url, preview_url=preview_url,
        expires_at=datetime.fromtimestamp(expires, UTC), retained_until=_retained_until(job, settings),
        kept=live and job.kept_at is not None,
        duration_s=duration_s, width=width, height=height, bytes=video.bytes, sha256=video.sha256,
        thumbnail_width=thumbnail.width, thumbnail_height=thumbnail.height,
        preview_width=preview.width if live and preview else None,
        preview_height=preview.height if live and preview else None,
        preview_duration_s=preview.duration_s if live and preview else None,
    )


def queue_position(job: JobRow, waiting_position: int | None) -> int | None:
    """A waiting job's place among its account's waiting jobs (interactive ones first); once submitted, its
    place in the provider's own queue where the provider reports one (fal does); otherwise none."""
    if job.status is JobStatus.PENDING:
        return waiting_position
    if job.status is JobStatus.SUBMITTED:
        return job.provider_queue_position
    return None


def estimate_out(made: Estimate | None) -> QueueEstimate | None:
    if made is None:
        return None
    return QueueEstimate(jobs_ahead=made.jobs_ahead, jobs_ahead_p90=made.jobs_ahead_p90, start_p50=made.start_p50,
                         start_p90=made.start_p90, ready_p50=made.ready_p50, ready_p90=made.ready_p90,
                         unavailable=made.unavailable, note=made.note)


def ready_out(made: ReadyRange | None) -> ReadyEstimate | None:
    if made is None:
        return None
    return ReadyEstimate(ready_p50=made.ready_p50, ready_p90=made.ready_p90, unavailable=made.unavailable,
                         note=made.note)


def retry_out(job: JobRow, settings: Settings) -> RetryOut | None:
    """What sent the job round again, once it was; the most attempts its provider's retry policy allows."""
    if job.retry_error is None:
        return None
    most = RetryPolicy.from_settings(settings, job.provider).max_attempts
    return RetryOut(code=job.retry_error.code, message=job.retry_error.message, max_attempts=most)


def cost(job: JobRow, provider_credits: int | None, absorbed: int | None) -> Cost:
    """What it was quoted and charged, what its renders were billed (`provider_credits`, summed over its
    attempts), and, once it ended and was settled, what the platform absorbed (`absorbed`, its ledger's entry;
    none: nothing)."""
    return Cost(estimated_credits=job.estimated_credits, actual_credits=job.actual_credits,
                provider_credits=provider_credits, absorbed_credits=(absorbed or 0) if job.finished else None)


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def job_urls(job_id: str, base_url: str = "") -> JobUrls:
    """Absolute under the deployment's public URL when it is set, else paths on this host."""
    own = f"{base_url.rstrip('/')}/v1/jobs/{job_id}"
    return JobUrls(get=own, cancel=f"{own}/cancel", stream=f"{own}/stream")


def job_view(job: JobRow, waiting_position: int | None, outputs: Outputs | None, storage: Storage,
             settings: Settings, estimate: Estimate | None = None, charges: Cost | None = None,
             ready: ReadyRange | None = None) -> JobOut:
    """`waiting_position` is the job's place among its account's waiting jobs, computed with the read;
    `outputs` its stored files, read with it from their one record; `estimate` a waiting job's, `ready` a
    rendering one's; `charges` its cost as read with it (what its renders were billed, what the platform
    absorbed); without it, only what the job row holds."""
    # Only a finished render has anything to link to; once expired, only its thumbnail.
    shown = job.status in (JobStatus.COMPLETED, JobStatus.EXPIRED)
    asked = job.request
    return JobOut(
        id=job.id, status=job.status, stage=stage_after(job.stage, job.status), model=job.model, prompt=asked.prompt,
        created_at=job.created_at.astimezone(UTC), updated_at=job.updated_at.astimezone(UTC),
        attempt=job.attempt, retry=retry_out(job, settings),
        queue_position=queue_position(job, waiting_position), queue_reason=job.wait_reason,
        priority=cast(Priority, job.lane.priority),  # Lane.priority spells the API's names
        estimate=estimate_out(estimate) if job.status is JobStatus.PENDING else None,
        ready=ready_out(ready) if job.status in RENDERING else None,
        progress=job.progress, error=job.error,
        outputs=_outputs(job, outputs, storage, settings) if shown and outputs is not None else None,
        cost=charges or cost(job, None, None),
        duration_s=asked.duration_s, aspect_ratio=asked.aspect_ratio, resolution=asked.resolution, seed=asked.seed,
        negative_prompt=asked.negative_prompt, input_image=asked.input_image, params=asked.params,
        metadata=job.metadata, fallback_models=job.fallback_models, max_wait_s=job.max_wait_s,
        started_at=_utc(job.submitted_at), completed_at=_utc(job.completed_at),
        deadline_at=_utc(job.deadline_at), retry_at=_utc(job.retry_at), rerun_of=job.rerun_of,
        urls=job_urls(job.id, settings.public_url),
    )


def trail_out(rows: Sequence[asyncpg.Record]) -> list[TransitionOut]:
    """A job's audit rows, oldest first, with the stage after each move: as stored, or, for a move the release
    before this one made (which stored none), as `states.stage_after` makes it from the moves before."""
    moves, reached = [], None
    for r in rows:
        to = JobStatus(r["to_status"])
        reached = Stage(r["stage"]) if r["stage"] is not None else stage_after(reached, to)
        moves.append(TransitionOut(from_=r["from_status"], to=to, stage=reached, at=r["at"], reason=r["reason"]))
    return moves
