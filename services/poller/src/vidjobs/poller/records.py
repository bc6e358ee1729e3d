"""What providers told the poller that the inbox does not hold, in its own table (`provider_answers`, migration
0029), so that `vidjobs inbox show` answers what a provider said about a job, polled or not: each status poll's
answer (a run of identical answers kept as one row that counts them), and each stored callback the poller
handled, with the job it was about, or none (a callback for an unknown render, which would otherwise leave
no trace but a log line).

A provider controls all of it, so all of it is bounded: a signal's strings are cut to TEXT_CHARS before they
are kept, a job keeps its newest `VIDJOBS_PROVIDER_ANSWERS_PER_JOB` rows, an unmatched callback has one row
(and the inbox caps those), and rows go after `VIDJOBS_WEBHOOK_RETENTION_DAYS`, as the inbox's do.

A record never stands in a job's way: one that cannot be written is logged, and the signal is acted on all
the same.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import asyncpg
import msgspec

from vidjobs.common import faults
from vidjobs.common.errors import ProviderError
from vidjobs.common.jobs import JobRow
from vidjobs.common.runtime import Runtime, every
from vidjobs.providers.base import ProviderSignal

log = logging.getLogger("vidjobs.poller.records")

TEXT_CHARS = 1024  # of each string a signal holds (an error message, a render URL)
PRUNE_BATCH = 5000
# What a refused status poll is kept as, in place of a provider state.
REFUSED = "refused"

# The job's newest row: a poll answering as it did is counted in it rather than kept again.
_LAST = """
SELECT id, kind, provider_job_id, state, signal -> 'error' ->> 'code' AS code FROM provider_answers
WHERE job_id = $1 ORDER BY id DESC LIMIT 1 FOR UPDATE
"""
_REPEAT = """
UPDATE provider_answers SET answers = answers + 1, last_at = clock_timestamp(), signal = $2::text::jsonb
WHERE id = $1
"""
# A callback handled again (a redelivery, `vidjobs inbox replay`) keeps its one row, with the job found now.
_ADD = """
INSERT INTO provider_answers (kind, provider, provider_job_id, job_id, inbox_id, state, signal)
VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb)
ON CONFLICT (inbox_id) DO UPDATE SET job_id = EXCLUDED.job_id, answers = provider_answers.answers + 1,
                                     last_at = clock_timestamp()
"""
_TRIM = """
DELETE FROM provider_answers WHERE job_id = $1 AND id <= (
    SELECT id FROM provider_answers WHERE job_id = $1 ORDER BY id DESC OFFSET $2 LIMIT 1)
"""
_PRUNE = """
DELETE FROM provider_answers WHERE id IN (
    SELECT id FROM provider_answers WHERE last_at < now() - make_interval(secs => $1 * 86400) LIMIT $2)
"""


def _cut(value: Any) -> Any:
    if isinstance(value, str):
        return value[:TEXT_CHARS]
    if isinstance(value, dict):
        return {key: _cut(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut(item) for item in value]
    return value


def bounded(signal: ProviderSignal | dict[str, Any]) -> str:
    """The signal as it is kept: JSON, each string cut to TEXT_CHARS."""
    return msgspec.json.encode(_cut(msgspec.to_builtins(signal))).decode()


async def poll_answered(pool: asyncpg.Pool, job: JobRow, sig: ProviderSignal, *, keep: int) -> None:
    """Keep what a status poll of `job` answered."""
    await _kept(_poll(pool, job, sig.provider_job_id, sig.state.value,
                      sig.error.code.value if sig.error else None, bounded(sig), keep), job.id)


async def poll_refused(pool: asyncpg.Pool, job: JobRow, err: ProviderError, *, keep: int) -> None:
    """Keep that the provider refused a status poll of `job` (it knows no such render, say), and why."""
    said = {"provider_job_id": job.provider_job_id, "error": err.to_job_error()}
    await _kept(_poll(pool, job, job.provider_job_id, REFUSED, err.code.value, bounded(said), keep), job.id)


async def callback_handled(pool: asyncpg.Pool, inbox_id: int, provider: str, sig: ProviderSignal,
                           job: JobRow | None, *, keep: int) -> None:
    """Keep which job a stored callback was about; `job` None: none of ours (an unknown render)."""
    await _kept(_callback(pool, inbox_id, provider, sig, job, keep), job.id if job else None)


async def _poll(pool: asyncpg.Pool, job: JobRow, provider_job_id: str | None, state: str, code: str | None,
                signal: str, keep: int) -> None:
    async with pool.acquire() as conn, conn.transaction():
        last = await conn.fetchrow(_LAST, job.id)
        if last is not None and last["kind"] == "poll" and (last["provider_job_id"], last["state"], last["code"]) \
                == (provider_job_id, state, code):
            await conn.execute(_REPEAT, last["id"], signal)
            return
        await conn.execute(_ADD, "poll", job.provider, provider_job_id, job.id, None, state, signal)
        await conn.execute(_TRIM, job.id, keep)


async def _callback(pool: asyncpg.Pool, inbox_id: int, provider: str, sig: ProviderSignal, job: JobRow | None,
                    keep: int) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_ADD, "callback", provider, sig.provider_job_id, job.id if job else None, inbox_id,
                           sig.state.value, bounded(sig))
        if job is not None:
            await conn.execute(_TRIM, job.id, keep)


async def _kept(write: Awaitable[None], job_id: str | None) -> None:
    try:
        await write
    except Exception as exc:
        if not faults.is_infrastructure(exc):
            log.exception("provider answer not kept", extra={"job_id": job_id})
            return
        log.warning("provider answer not kept", extra={"job_id": job_id, "error": repr(exc)})


async def prune(pool: asyncpg.Pool, retention_days: float) -> int:
    """Delete rows last added to longer ago than `retention_days`, in batches; how many went."""
    removed = 0
    while True:
        count = int((await pool.execute(_PRUNE, retention_days, PRUNE_BATCH)).split()[-1])
        removed += count
        if count < PRUNE_BATCH:
            return removed


async def prune_every(rt: Runtime) -> None:
    """Prune with the inbox's retention, as often as the gateway prunes the inbox, until the poller stops."""
    async def one_pass() -> None:
        await prune(rt.pool, rt.settings.webhook_retention_days)
    await every(rt, rt.settings.idempotency_sweep_interval_s, one_pass, "provider answers prune")

