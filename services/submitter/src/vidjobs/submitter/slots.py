"""May this job be sent now, and if not, why and until when: the one decision the worker asks for each slot
it hands out (`take`), and the cheap look the queue sweep takes first (`has_room`).

A slot goes out only past, in order: the platform switch, the provider's circuit breaker (`breakers`), its
concurrency cap (`capacity`), the fair head of its queue and that account's own cap (`dispatch`), and its
request-rate bucket (`capacity`). Then the submission row of the job it went to is claimed (`submissions`),
in the same transaction, so a slot is never handed out without the claim that holds it.

Every decision for one provider runs under that provider's transaction-scoped advisory lock, so two
replicas can never both take the last slot or token. Every submitter transaction that writes for a provider
takes that lock first, which also gives all of them one lock order (provider, account, job rows, submission,
breaker) and so no deadlocks.

A job that must wait is parked (its wait reason says why) and costs nothing until an event that frees a slot
(a render ending, a breaker closing, the switch resumed, the queue sweep) hands that slot to the fair head of
the provider's queue. A pacing wait (a rate token, a race just lost) is over in a moment instead: its message
looks again then.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import asyncpg
import msgspec

from vidjobs.common import breakers, jobs, switch, waiting
from vidjobs.common.jobs import JobRow
from vidjobs.common.settings import ProviderLimits
from vidjobs.common.states import JobStatus
from vidjobs.submitter import capacity, dispatch, submissions
from vidjobs.submitter.dispatch import Pick

log = logging.getLogger("vidjobs.submitter.slots")

# How soon a job held back by the platform switch looks again.
PAUSED_LOOK_S = 5.0
# How soon the fair head looks again after another provider's replica took its account's last slot.
RACE_LOOK_S = 0.2


class Wait(msgspec.Struct, frozen=True):
    """The job stays queued, for this reason. A pacing wait is over in about `delay_s`, so its message looks
    again then; any other lasts until an event frees a slot, and the job is parked meanwhile."""

    delay_s: float
    reason: str
    kind: str  # paused | breaker | concurrency | account | rate: a bounded metric label
    pacing: bool = False


class Turn(msgspec.Struct, frozen=True):
    """A slot went to `job` (the one asked about, or the fair head of its provider's queue), and its
    submission is claimed as `claimed` says (which may be: busy elsewhere, or answered already)."""

    job: JobRow
    claimed: submissions.Claimed


async def lock_provider(conn: asyncpg.Connection, provider: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('vidjobs.provider'), hashtext($1))", provider)


async def take(
    conn: asyncpg.Connection, job: JobRow, limits: ProviderLimits, claim_ttl_s: float, *, fair: bool = True,
) -> Turn | Wait | None:
    """Hand out the next slot of `job`'s provider and claim the submission of the job it goes to, or say
    why `job` waits (recording that as its wait reason, parked unless it is pacing). None: `job` moved on,
    or the head it went to moved on or could not be claimed. Call inside a transaction; takes the provider's
    lock first. `fair=False` offers the slot to `job` itself, not the queue's head (for a turn after the
    head could not be claimed).

    Writes, when a slot goes out: a rate token spent, the account's turn, the claim, and the breaker's probe
    if the job is the one to test a provider that was down."""
    await lock_provider(conn, job.provider)
    if not await _still_waiting(conn, job):
        return None
    choice = await choose(conn, job, limits, claim_ttl_s, fair=fair)
    if isinstance(choice, Wait):
        await waiting.set_wait_reason(conn, job.id, choice.reason, park=not choice.pacing)
        return choice
    if choice.job_id != job.id:
        return await _claim_head(conn, choice.job_id, claim_ttl_s)
    return Turn(job=job, claimed=await submissions.claim(conn, submissions.request_for(job), job.provider,
                                                         ttl_s=claim_ttl_s))


async def choose(
    conn: asyncpg.Connection, job: JobRow, limits: ProviderLimits, claim_ttl_s: float, *, fair: bool = True,
) -> Pick | Wait:
    """`take` without the claim: who takes the provider's next slot, or why `job` waits. Call under the
    provider's lock. Spends a rate token and records the account's turn only when it picks."""
    if (stop := await _paused(conn)) is not None:
        return stop
    probe = await _breaker(conn, job)
    if isinstance(probe, Wait):
        return probe
    busy = await capacity.in_flight(conn, job.provider, claim_ttl_s)
    if busy >= limits.concurrency:
        return Wait(0.0, f"{job.provider} already has {busy} renders in flight, its limit", "concurrency")
    # The breaker's probe tests the provider itself, rather than the queue's head.
    pick = Pick(job_id=job.id, account_id=job.account_id) if probe or not fair else \
        await dispatch.fair_head(conn, job.provider, claim_ttl_s)
    if pick is None:
        return Wait(0.0, await dispatch.account_wait(conn, job.account_id, claim_ttl_s), "account")
    await dispatch.lock_account(conn, pick.account_id)
    taken, cap = await dispatch.account_load(conn, pick.account_id, claim_ttl_s)
    if taken >= cap:
        # Another provider's replica gave this account its last slot a moment ago.
        if pick.job_id == job.id:
            return Wait(0.0, await dispatch.account_wait(conn, job.account_id, claim_ttl_s), "account")
        return Wait(RACE_LOOK_S, "waiting for a free slot", "account", pacing=True)
    if (token_in := await capacity.take_token(conn, job.provider, limits)) is not None:
        return Wait(token_in, f"pacing submissions to {job.provider} at {limits.rate_per_s:g} per second",
                    "rate", pacing=True)
    await dispatch.take_turn(conn, pick.account_id)
    return pick


async def has_room(conn: asyncpg.Connection | asyncpg.Pool, provider: str, limits: ProviderLimits,
                   claim_ttl_s: float) -> bool:
    """Whether a slot of the provider could be handed out now, judged without its lock (the sweep's cheap
    look; `take` decides under the lock): submissions not paused, the breaker not pausing it, and fewer
    renders in flight than its cap."""
    if (await switch.submissions(conn)).paused or await breakers.pausing(conn, provider):
        return False
    return await capacity.in_flight(conn, provider, claim_ttl_s) < limits.concurrency


async def _paused(conn: asyncpg.Connection) -> Wait | None:
    state = await switch.submissions(conn)
    if not state.paused:
        return None
    why = f": {state.reason}" if state.reason else ""
    return Wait(PAUSED_LOOK_S, f"new submissions are paused for the whole platform{why}", "paused")


async def _breaker(conn: asyncpg.Connection, job: JobRow) -> Wait | bool:
    """Why the provider's breaker holds `job` back, or whether `job` goes as its probe (made the probe here
    when the breaker's pause has run out)."""
    said = breakers.admission(await breakers.read(conn, job.provider), job.id, datetime.now(UTC))
    if said.wait_s is not None:
        return Wait(said.wait_s, said.reason or f"{job.provider} is paused", "breaker")
    if said.starts_probe:
        await breakers.start_probe(conn, job.provider, job.id)
    return said.probe


async def _still_waiting(conn: asyncpg.Connection, job: JobRow) -> bool:
    """Whether the job is still pending at the attempt we read; holds its row until the claim commits."""
    row = await conn.fetchrow(
        "SELECT status, attempt FROM jobs WHERE id = $1 AND deleted_at IS NULL FOR SHARE", job.id)
    return row is not None and row["status"] == JobStatus.PENDING and row["attempt"] == job.attempt


async def _claim_head(conn: asyncpg.Connection, job_id: str, claim_ttl_s: float) -> Turn | None:
    """Claim another job's submission; None if it is no longer waiting or that fails. A job that breaks its
    own submission must not break the messages of the jobs queued behind it."""
    try:
        async with conn.transaction():  # a savepoint: this transaction goes on either way
            head = await jobs.fetch(conn, job_id)
            if head is None or not await _still_waiting(conn, head):
                return None
            claimed = await submissions.claim(conn, submissions.request_for(head), head.provider,
                                              ttl_s=claim_ttl_s)
            return Turn(job=head, claimed=claimed)
    except (asyncpg.PostgresError, msgspec.ValidationError):
        log.exception("could not claim the head of the queue", extra={"job_id": job_id})
        return None
