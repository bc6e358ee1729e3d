"""Renders whose job no row holds. A failover to an asynchronous standby loses the commits the standby had not
received yet: a job acknowledged to its caller, submitted, perhaps even copied, is then gone with its credit
reservation and its trail, while its render goes on at the provider. Nothing outlives its row: the first
verified callback naming that job id asks the provider to stop the render (when it is still queued or
running), and its provider_answers row says so (`stop_asked_at`, shown by `vidjobs inbox unmatched`). No job is
made of it, so no app webhook is sent and no credit moves; the objects a copy may have stored are the orphan
sweep's (vidjobs.media.orphans).

Only a callback naming our job id is acted on: one that names just a render id may be about a render whose
submit answer is not recorded yet, which its job will still adopt."""

from __future__ import annotations

import logging

import asyncpg

from vidjobs.common import db, jobs, outbox
from vidjobs.common.events import CancelRequested
from vidjobs.poller.records import bounded
from vidjobs.providers.base import ProviderSignal, ProviderState

log = logging.getLogger("vidjobs.poller.lost_rows")

# What may still be stopped: a render that has ended costs nothing more.
STOPPABLE = frozenset({ProviderState.QUEUED, ProviderState.RUNNING})

# The callback's row (one per stored callback, as records.callback_handled keeps it), marked in the same
# transaction as the message that asks the provider to stop: either both are committed or neither.
_KEEP = """
INSERT INTO provider_answers (kind, provider, provider_job_id, job_id, inbox_id, state, signal, stop_asked_at)
VALUES ('callback', $1, $2, NULL, $3, $4, $5::text::jsonb, CASE WHEN $6 THEN clock_timestamp() END)
ON CONFLICT (inbox_id) DO UPDATE SET answers = provider_answers.answers + 1, last_at = clock_timestamp(),
    stop_asked_at = coalesce(provider_answers.stop_asked_at, EXCLUDED.stop_asked_at)
"""


async def names_a_lost_job(conn: asyncpg.Connection | asyncpg.Pool, sig: ProviderSignal) -> bool:
    """Whether `sig` is a verified signal naming a job id of ours that no row holds (deleted ones included)."""
    return sig.verified and sig.job_id is not None and await jobs.fetch(conn, sig.job_id) is None


async def stop_render(pool: asyncpg.Pool, inbox_id: int, provider: str, sig: ProviderSignal) -> bool:
    """Keep the callback about a lost job and, if its render may still be going, ask the provider to stop it;
    True if asked. A redelivered callback asks again (a cancel is harmless twice) and keeps its first time."""
    assert sig.job_id is not None
    stop = sig.state in STOPPABLE
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_KEEP, provider, sig.provider_job_id, inbox_id, sig.state.value, bounded(sig), stop)
        if stop:
            # No model name: the job that knew it is gone, so a provider that needs one looks the render up.
            stop_it = CancelRequested(job_id=sig.job_id, provider=provider, provider_job_id=sig.provider_job_id,
                                      model_name=None)
            await outbox.add(db.lent(conn), [stop_it])
    log.warning("a render for a job no row holds; %s", "asked the provider to stop it" if stop else "it has ended",
                extra={"job_id": sig.job_id, "provider": provider, "provider_job_id": sig.provider_job_id,
                       "state": sig.state.value, "inbox_id": inbox_id})
    return stop
