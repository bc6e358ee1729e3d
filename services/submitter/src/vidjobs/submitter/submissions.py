"""The submitter's table: one row per job attempt, written before the provider is called.

A row is claimed while a submitter is calling the provider. A claim older than the claim TTL (longer than a
provider call may take) belongs to a submitter that died mid-call; it may be taken over, but only after
asking the provider whether the attempt already exists, so a crash never renders twice.
"""

from __future__ import annotations

import enum

import asyncpg
import msgspec

from vidjobs.common.errors import JobError
from vidjobs.common.jobs import JobRow
from vidjobs.providers.base import SubmitRequest


class Claim(enum.Enum):
    FRESH = "fresh"  # first call for this attempt
    TAKEN_OVER = "taken_over"  # an earlier call died or was refused; ask the provider before resubmitting
    UNCLEAR = "unclear"  # taken over, and its outcome was unclear: an unanswered attempt kept (unclear.py)
    ACCEPTED = "accepted"  # the provider already accepted this attempt
    BUSY = "busy"  # another submitter is calling right now
    MOVED_ON = "moved_on"  # the job is no longer waiting for this attempt: nothing to submit


class Claimed(msgspec.Struct):
    claim: Claim
    provider_job_id: str | None = None


def request_for(job: JobRow) -> SubmitRequest:
    """What the claim of a job's submission row needs, for its current attempt; the full request (with its
    callback and input image URLs) is built from it once the claim is ours."""
    return SubmitRequest(job_id=job.id, attempt=job.attempt, idempotency_key=f"{job.id}-a{job.attempt}",
                         request=job.request)


async def claim(conn: asyncpg.Connection, req: SubmitRequest, provider: str, *, ttl_s: float) -> Claimed:
    row = await conn.fetchrow(
        """
        INSERT INTO provider_submissions (job_id, attempt, provider, idempotency_key)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT ON CONSTRAINT provider_submissions_one_per_attempt DO NOTHING
        RETURNING id
        """,
        req.job_id, req.attempt, provider, req.idempotency_key,
    )
    if row is not None:
        return Claimed(Claim.FRESH)
    existing = await conn.fetchrow(
        """
        UPDATE provider_submissions SET claimed_at = now(), answered_at = NULL, error = NULL
        WHERE job_id = $1 AND attempt = $2 AND provider_job_id IS NULL
          AND (error IS NOT NULL OR claimed_at < now() - make_interval(secs => $3))
        RETURNING unclear_at IS NOT NULL AS unclear
        """,
        req.job_id, req.attempt, ttl_s,
    )
    if existing is not None:
        return Claimed(Claim.UNCLEAR if existing["unclear"] else Claim.TAKEN_OVER)
    accepted = await conn.fetchval(
        "SELECT provider_job_id FROM provider_submissions WHERE job_id = $1 AND attempt = $2",
        req.job_id, req.attempt,
    )
    if accepted is not None:
        return Claimed(Claim.ACCEPTED, provider_job_id=accepted)
    return Claimed(Claim.BUSY)


async def record_accepted(conn: asyncpg.Connection, req: SubmitRequest, provider_job_id: str) -> None:
    await conn.execute(
        """
        UPDATE provider_submissions SET provider_job_id = $3, answered_at = now(), error = NULL
        WHERE job_id = $1 AND attempt = $2
        """,
        req.job_id, req.attempt, provider_job_id,
    )


async def record_refused(conn: asyncpg.Connection, req: SubmitRequest, error: JobError) -> None:
    await conn.execute(
        "UPDATE provider_submissions SET error = $3, answered_at = now() WHERE job_id = $1 AND attempt = $2",
        req.job_id, req.attempt, msgspec.to_builtins(error),
    )


async def renew(conn: asyncpg.Connection, req: SubmitRequest) -> None:
    """Keep a claim that is still calling the provider (resolving an unclear outcome) from looking dead."""
    await conn.execute(
        """
        UPDATE provider_submissions SET claimed_at = now(), unclear_calls = unclear_calls + 1, unclear_at = now()
        WHERE job_id = $1 AND attempt = $2 AND provider_job_id IS NULL
        """,
        req.job_id, req.attempt,
    )
