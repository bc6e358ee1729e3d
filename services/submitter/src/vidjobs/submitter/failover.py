"""Failover: a waiting job that names fallback models moves to the first one that can start it sooner.

Two things make a job move, and nothing else does (a job without `fallback_models` waits where it is):
- its provider's breaker holds every job back (the provider is failing): any fallback whose own provider is
  not held back starts it sooner than a provider that takes nothing;
- its estimated start is later than its `max_wait_s` allows (`max_wait_until`): a fallback moves it only if
  that fallback's own estimate for a job joining its queue now is sooner.
Either way the fallback must render the request for no more than the credits reserved for it, on the rate
card it was quoted from: a cheaper one lowers the reservation to its own quote, a dearer one is never used.

The move is a transition from pending to pending, with the reason in the job's trail and `job.moved` for
its app's webhooks, and it changes what the job renders with (model, provider, request, quote) and its
remaining fallbacks (those after the one it took), in one transaction under the old provider's lock, so no
submitter of that provider can be claiming it meanwhile. Its message for the new provider goes out with it.

Occasions to look: a job's own message finds it must wait (its create, its retry), and the queue sweep, for
each provider with movable jobs waiting (a bounded batch each time, through the index jobs_waiting_movable,
which holds only jobs with fallbacks).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import breakers, changes, credits, jobs, metrics, ratecard
from vidjobs.common.events import JobQueued
from vidjobs.common.jobs import JobRow
from vidjobs.common.states import SQL_PENDING, JobStatus
from vidjobs.common.transitions import Guard, JobUpdate, transition
from vidjobs.submitter import slots

log = logging.getLogger("vidjobs.submitter.failover")

# Movable jobs looked at per provider and sweep: a provider whose breaker opens with thousands of them waiting
# moves them a batch at a time, one sweep after another.
SWEEP_BATCH = 100


class Why(enum.StrEnum):
    BREAKER = "breaker"
    MAX_WAIT = "max_wait"


class Target(msgspec.Struct, frozen=True):
    model: str
    quote: int  # credits, on the job's rate card
    rest: list[str]  # the fallbacks after it, kept for a further move


# Whether a fallback model would start a job joining its queue now before `before` (None: no estimate).
Sooner = Callable[[asyncpg.Connection, JobRow, str, datetime | None], Awaitable[bool]]


async def movable(conn: asyncpg.Connection | asyncpg.Pool, provider: str, why: Why,
                  limit: int = SWEEP_BATCH) -> list[str]:
    """Ids of the provider's waiting jobs that may move: in queue order while its breaker holds them back,
    else those whose max_wait_until comes first (a job whose limit is furthest off is looked at last)."""
    extra = "AND max_wait_until IS NOT NULL ORDER BY max_wait_until, created_at, id" if why is Why.MAX_WAIT \
        else "ORDER BY created_at, id"
    rows = await conn.fetch(
        f"""SELECT id FROM jobs WHERE provider = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
            AND fallback_models <> '{{}}' {extra} LIMIT $2""", provider, limit)
    return [r["id"] for r in rows]


async def _priced(conn: asyncpg.Connection, job: JobRow, model: str) -> int | None:
    """The job's request on `model`, priced on the card it was quoted from; None where that card has no price."""
    card = await (ratecard.version(conn, job.rate_card_version) if job.rate_card_version is not None
                  else ratecard.current(conn))
    try:
        return ratecard.estimate(card, msgspec.structs.replace(job.request, model=model))
    except ratecard.Unpriced:
        return None


async def target(conn: asyncpg.Connection, job: JobRow, offered: frozenset[str], why: Why,
                 sooner: Sooner, start: datetime | None) -> Target | None:
    """The first of the job's fallbacks that can take it: offered here, its provider not held back by its
    breaker, priced within the job's quote, and (for a limit passed) starting sooner than `start`."""
    for i, model in enumerate(job.fallback_models):
        provider = model.split("/", 1)[0]
        if provider not in offered or provider == job.provider or await breakers.pausing(conn, provider):
            continue
        quote = await _priced(conn, job, model)
        if quote is None or quote > job.estimated_credits:
            continue  # never dearer than what was reserved
        if why is Why.MAX_WAIT and not await sooner(conn, job, model, start):
            continue
        return Target(model=model, quote=quote, rest=job.fallback_models[i + 1:])
    return None


async def _may_move(conn: asyncpg.Connection, job: JobRow) -> bool:
    """Still waiting at the attempt read, not being submitted for it, and not its breaker's probe."""
    return bool(await conn.fetchval(
        f"""
        SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
                                           AND attempt = $2 AND provider = $3)
           AND NOT EXISTS (SELECT 1 FROM provider_submissions WHERE job_id = $1 AND attempt = $2)
           AND NOT EXISTS (SELECT 1 FROM provider_breakers WHERE provider = $3 AND probe_job_id = $1)
        """, job.id, job.attempt, job.provider))


async def reprice(conn: asyncpg.Connection, job_id: str, amount: int, note: str) -> credits.Entry:
    """Lower the moving job's reservation to `amount`, its new quote (reprice_job_credit, migration 0019:
    it refuses to raise one, or to touch a job that is not waiting)."""
    try:
        row = await conn.fetchrow("SELECT * FROM reprice_job_credit($1, $2, $3)", job_id, amount, note)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise credits.CreditRefused(exc.message) from exc
    assert row is not None  # the function returns its ledger row or raises
    return msgspec.convert(dict(row), credits.Entry)


async def move(conn: asyncpg.Connection, job: JobRow, to: Target, why: Why, detail: str) -> bool:
    """Move the job to `to`, in the caller's transaction (which holds the job's provider's lock)."""
    moved = await transition(
        conn, job.id, JobStatus.PENDING, expect=[JobStatus.PENDING], guard=Guard(attempt=job.attempt),
        reason=f"moved from {job.model} to {to.model}: {detail}",
        update=JobUpdate(model=to.model, provider=to.model.split("/", 1)[0],
                         request=msgspec.structs.replace(job.request, model=to.model),
                         estimated_credits=to.quote, fallback_models=to.rest),
        emit=[JobQueued(job_id=job.id)],
    )
    if moved is None:
        return False
    if to.quote < job.estimated_credits:
        await reprice(conn, job.id, to.quote, (
            f"{job.id} moved from {job.model} to {to.model}: its quote falls from {job.estimated_credits} "
            f"to {to.quote} credits"))
    changes.on_commit(lambda: metrics.JOB_MOVES.labels(job.model, to.model, job.route or "", why.value).inc())
    return True


async def consider(conn: asyncpg.Connection, job_id: str, offered: frozenset[str], why: Why, detail: str,
                   sooner: Sooner, start: datetime | None = None) -> str | None:
    """Move the job if one of its fallbacks can take it; the model it moved to, or None. Call inside a
    transaction; takes the job's provider's lock first, as every submitter decision does."""
    job = await jobs.fetch(conn, job_id)
    if job is None or not job.fallback_models:
        return None
    await slots.lock_provider(conn, job.provider)
    if not await _may_move(conn, job):
        return None
    chosen = await target(conn, job, offered, why, sooner, start)
    if chosen is None or not await move(conn, job, chosen, why, detail):
        return None
    log.info("waiting job moved to a fallback model", extra={
        "job_id": job.id, "from": job.model, "to": chosen.model, "why": why.value})
    return chosen.model
