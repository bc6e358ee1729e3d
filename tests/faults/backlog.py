"""A backlog beside every scenario's workload: jobs that wait for the whole run behind a full quota, spread over
many accounts, on a provider the workload never uses (`fake-poll`). Waiting is free (a waiting job is parked:
no message, no timer), so the workload must come through its fault as it would alone, and the backlog must
come out intact: every job still pending at its first attempt, never submitted, never moved, still parked,
and holding no message.

Its size is VIDJOBS_FAULTS_BACKLOG (`python -m tests.faults --backlog N` sets it), DEFAULT_SIZE when unset;
0 runs a scenario without one. The jobs are queued as a create queues them (`creation.enqueue`: the credit
reservation, the audit row, the submit message and the first recovery check), after the stack is up and
before the workload begins, and each has had its one pass through the submitter (it is parked) before the
scenario goes on."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from tests.faults.collector import provider_counters, status_counts
from tests.faults.jsapi import jetstream, submitter_consumer
from tests.faults.report import Row
from vidjobs.common import creation, db
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import ProviderLimits, Settings
from vidjobs.common.states import SQL_PENDING
from vidjobs.gateway.accounts import create_account

ENV = "VIDJOBS_FAULTS_BACKLOG"
DEFAULT_SIZE = 200
ACCOUNTS = 50
PROVIDER = "fake-poll"
REQUEST = JobRequest(model=f"{PROVIDER}/default", prompt="fault suite backlog", duration_s=1, seed=7,
                     params={"render_s": 1})
# The quota is full for the whole run because it has no slot at all. A render holding its one slot would not
# do: the render deadline (180 s in the suite) ends it during a long run and hands that slot to the backlog.
FULL_QUOTA = {PROVIDER: ProviderLimits(concurrency=0)}
ENQUEUE_CONNECTIONS = 4
# Each queued job's one pass through the submitter (to be parked) must be over within this, plus a second for
# every hundred jobs; a submitter that needs longer is reported, not waited for.
PARK_WITHIN_S = 30.0
# After the run the submitter may hold a wake-up or two (the waiting queue's workload still waits); anything
# more, once this long has let deferrals and ack waits come round, is a message some waiting job holds.
MESSAGES_IN_FLIGHT = 2
QUIET_WITHIN_S = 20.0


@dataclass(frozen=True)
class Backlog:
    ids: list[str]
    accounts: int


def configured_size() -> int:
    """The backlog size from VIDJOBS_FAULTS_BACKLOG; DEFAULT_SIZE when unset."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_SIZE
    if not raw.isdigit():
        raise ValueError(f"{ENV}={raw!r}: give the number of backlog jobs as a whole number (0 for none)")
    return int(raw)


async def _accounts(conn: asyncpg.Connection, count: int) -> list[str]:
    """Accounts whose own limits never hold their jobs back: only the provider's quota does."""
    run = secrets.token_hex(3)
    made = []
    for n in range(count):
        account_id, _ = await create_account(conn, f"backlog-{run}-{n}", credits=10**9, concurrency=2,
                                             requests_per_s=1000.0, request_burst=1000)
        made.append(account_id)
    return made


async def _enqueue(database_url: str, accounts: list[str], size: int, recovery_delay_s: float) -> list[str]:
    """`size` jobs, round robin over the accounts, in a few lanes at once."""
    pool = await asyncpg.create_pool(database_url, min_size=ENQUEUE_CONNECTIONS, max_size=ENQUEUE_CONNECTIONS,
                                     init=db.init_connection)
    ids: list[str] = []

    async def lane(first: int) -> None:
        async with pool.acquire() as conn:
            for n in range(first, size, ENQUEUE_CONNECTIONS):
                async with conn.transaction():
                    made = await creation.enqueue(conn, account_id=accounts[n % len(accounts)], request=REQUEST,
                                                  estimated_credits=10, recovery_delay_s=recovery_delay_s)
                ids.append(made.job.id)

    try:
        await asyncio.gather(*(lane(first) for first in range(ENQUEUE_CONNECTIONS)))
    finally:
        await pool.close()
    return ids


async def _parked(conn: asyncpg.Connection, ids: list[str]) -> int:
    """Backlog jobs waiting with nothing of their own scheduled: looked at once (`waited_at`), no check due."""
    return await conn.fetchval(f"SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = {SQL_PENDING} "
                               "AND deleted_at IS NULL AND recover_at IS NULL AND waited_at IS NOT NULL", ids)


async def _stragglers(conn: asyncpg.Connection, ids: list[str]) -> str:
    """The first few jobs not parked, as the database has them."""
    rows = await conn.fetch(f"SELECT id, status, waited_at, recover_at FROM jobs WHERE id = ANY($1) AND NOT "
                            f"(status = {SQL_PENDING} AND deleted_at IS NULL AND recover_at IS NULL "
                            "AND waited_at IS NOT NULL) ORDER BY id LIMIT 5", ids)
    return "not parked: " + ", ".join(f"{r['id']} ({r['status']}, looked at {r['waited_at']}, "
                                      f"next check {r['recover_at']})" for r in rows)


async def _wait_parked(conn: asyncpg.Connection, ids: list[str]) -> None:
    loop = asyncio.get_running_loop()
    allowed_s = PARK_WITHIN_S + len(ids) / 100
    deadline = loop.time() + allowed_s
    while (parked := await _parked(conn, ids)) < len(ids):
        if loop.time() > deadline:
            raise RuntimeError(f"only {parked} of {len(ids)} backlog jobs were parked within {allowed_s:.0f} s "
                               f"of being queued: see the submitter's log; {await _stragglers(conn, ids)}")
        await asyncio.sleep(0.2)


async def queue(database_url: str, size: int, *, recovery_delay_s: float, say: Callable[[str], None]) -> Backlog:
    """Queue the backlog and wait until every job of it is parked behind the full quota."""
    conn = await asyncpg.connect(database_url)
    try:
        accounts = await _accounts(conn, min(ACCOUNTS, size))
        ids = await _enqueue(database_url, accounts, size, recovery_delay_s)
        await _wait_parked(conn, ids)
    finally:
        await conn.close()
    say(f"backlog: {size} jobs over {len(accounts)} accounts parked behind {PROVIDER}'s full quota")
    return Backlog(ids, len(accounts))


@dataclass(frozen=True)
class Found:
    """What became of the backlog, from the database and the fake provider."""

    counts: dict[str, int]  # jobs by status
    first_attempt: int  # still pending at their first attempt
    parked: int
    moves: int  # audit rows besides each job's creation
    submitted: int  # provider_submissions rows
    rendered: int  # renders the fake provider started for them


async def _found(database_url: str, fake_provider_url: str, ids: list[str]) -> Found:
    conn = await asyncpg.connect(database_url)
    try:
        counts = await status_counts(conn, ids)
        first_attempt = await conn.fetchval(f"SELECT count(*) FROM jobs WHERE id = ANY($1) "
                                            f"AND status = {SQL_PENDING} AND deleted_at IS NULL AND attempt = 1", ids)
        parked = await _parked(conn, ids)
        moves = await conn.fetchval("SELECT count(*) FROM job_transitions WHERE job_id = ANY($1) "
                                    "AND from_status IS NOT NULL", ids)
        submitted = await conn.fetchval("SELECT count(*) FROM provider_submissions WHERE job_id = ANY($1)", ids)
    finally:
        await conn.close()
    rendered = set(ids) & set((await provider_counters(fake_provider_url)).get("renders_by_job", {}))
    return Found(dict(counts), first_attempt, parked, moves, submitted, len(rendered))


async def _messages_held(nats_url: str) -> int:
    """The submitter's messages once it is done with what is in flight: parked jobs hold none, so after the
    run this comes down to a wake-up or two, or none. Waits out a redelivery still due (a deferral, an ack
    wait) before counting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_WITHIN_S
    async with jetstream(nats_url.split(",")) as (_, js):
        while True:
            info = await submitter_consumer(js)
            held = info.num_pending + info.num_ack_pending
            if held <= MESSAGES_IN_FLIGHT or loop.time() > deadline:
                return held
            await asyncio.sleep(0.5)


async def check(row: Row, settings: Settings, backlog: Backlog) -> None:
    """After the run: every backlog job still pending at its first attempt, parked, with no move in its trail
    but its creation, no submission row, no render at the provider, and no message held for it."""
    size = len(backlog.ids)
    found = await _found(settings.database_url, settings.fake_provider_url, backlog.ids)
    held = await _messages_held(settings.nats_url)
    row.backlog = size
    row.notes.append(f"backlog of {size} over {backlog.accounts} accounts behind {PROVIDER}'s full quota: "
                     f"{found.first_attempt} pending at their first attempt, {found.parked} parked, {found.moves} "
                     f"moves, {found.submitted} submitted, {found.rendered} rendered; the submitter held {held} "
                     "messages at the end")
    row.expect(found.first_attempt == size, f"backlog not intact: {found.counts} of {size} "
                                            f"({found.first_attempt} still pending at their first attempt)")
    row.expect(found.parked == size, f"{size - found.parked} backlog jobs no longer parked (a recovery check of "
                                     "their own came back)")
    row.expect(found.moves == 0, f"{found.moves} moves in the backlog's trails while its quota was full")
    row.expect(found.submitted == 0 and found.rendered == 0,
               f"backlog jobs submitted while the quota was full: {found.submitted} submission rows, "
               f"{found.rendered} renders at the provider")
    row.expect(held <= MESSAGES_IN_FLIGHT,
               f"the submitter still held {held} messages {QUIET_WITHIN_S:.0f} s after the run, with {size} jobs "
               f"parked (at most {MESSAGES_IN_FLIGHT} in flight allowed): waiting jobs hold messages")
