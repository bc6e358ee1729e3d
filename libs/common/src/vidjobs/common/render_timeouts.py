"""A render past its deadline (vidjobs.common.render_deadlines) that its provider has not finished.

It is declared only after the provider was asked once more at the deadline and said it is still rendering
(the poller), or did not answer that question in time (the reaper): a render that finished between the last
check and the deadline is downloaded, not thrown away."""

from __future__ import annotations

import logging

import asyncpg

from vidjobs.common import jobs, outbox
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.jobs import JobRow
from vidjobs.common.outcomes import fail_or_retry
from vidjobs.common.retry import Policies
from vidjobs.common.states import RENDERING
from vidjobs.common.transitions import Guard, Transitioned

log = logging.getLogger("vidjobs.render_timeouts")

# The reason of the poll that asks a render's provider at its deadline (PollRequested.reason).
DEADLINE_POLL = "deadline"


async def time_out(conn: asyncpg.Connection, job: JobRow, policies: Policies, *, why: str) -> Transitioned | None:
    """The render fails with `render_timeout` (tried again only where the provider's retry policy says
    `retry_on_timeout`), its credit reservation is released as every failure's is, and the provider is asked
    to stop it, whatever happens next. Applies only while the job is still on that render."""
    retried = policies.for_provider(job.provider).retry_on_timeout
    error = JobError.of(ErrorCode.RENDER_TIMEOUT, _message(job, retried=retried))
    moved = await fail_or_retry(conn, job, error, policies=policies, reason=f"render deadline passed ({why})",
                                expect=RENDERING, guard=Guard(attempt=job.attempt, provider_job_id=job.provider_job_id))
    if moved is not None:
        log.info("render timed out", extra={"job_id": job.id, "to": moved.job.status.value, "why": why,
                                            "provider_job_id": job.provider_job_id})
        # Whatever happens next, this render is abandoned: stop paying for it.
        await outbox.add(conn, jobs.stop_at_provider(job))
    return moved


def _message(job: JobRow, *, retried: bool) -> str:
    allowed = ""
    if job.deadline_at is not None and job.submitted_at is not None:
        allowed = f" within {(job.deadline_at - job.submitted_at).total_seconds():.0f} s"
    then = ("it was stopped and is tried again while attempts remain" if retried
            else "it was stopped and its credit released. Render it again to try once more")
    return f"The provider did not finish the render{allowed}, its deadline; {then}."
