"""A stored job as the API shows it: stage from status, signed URLs made at read time."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.common.jobs import JobRow, Outputs
from libs.common.states import STAGE_OF, JobStatus
from libs.storage.base import Storage
from services.gateway.bodies import Cost, JobOut, JobOutputs


def _outputs(outputs: Outputs, storage: Storage, ttl_s: int) -> JobOutputs:
    video_url, expires = storage.signed_url(outputs.video_key, ttl_s)
    thumbnail_url, _ = storage.signed_url(outputs.thumbnail_key, ttl_s)
    preview_url = storage.signed_url(outputs.preview_key, ttl_s)[0] if outputs.preview_key else None
    return JobOutputs(
        video_url=video_url, thumbnail_url=thumbnail_url, preview_url=preview_url,
        expires_at=datetime.fromtimestamp(expires, UTC), duration_s=outputs.duration_s, width=outputs.width,
        height=outputs.height, bytes=outputs.bytes, sha256=outputs.sha256,
    )


def job_view(job: JobRow, storage: Storage, ttl_s: int) -> JobOut:
    # Only a finished, still-retained render has anything to link to.
    ready = job.status is JobStatus.COMPLETED and job.outputs is not None
    return JobOut(
        id=job.id, status=job.status, stage=STAGE_OF[job.status], model=job.model, prompt=job.request.prompt,
        created_at=job.created_at.astimezone(UTC), updated_at=job.updated_at.astimezone(UTC),
        # Until per-account slots exist, the only queue a job waits in is its provider's (fal reports it).
        attempt=job.attempt, queue_position=job.provider_queue_position, queue_reason=job.wait_reason,
        progress=job.progress, error=job.error,
        outputs=_outputs(job.outputs, storage, ttl_s) if ready else None,
        cost=Cost(estimated_credits=job.estimated_credits, actual_credits=job.actual_credits),
    )
