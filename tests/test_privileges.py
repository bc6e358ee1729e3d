"""What the service roles may not do, proven by PostgreSQL refusing it (vidjobs.common.grants): no worker
reads a webhook secret, no service changes an account's credit by hand, and the credit functions release and
charge only what a job's reservation allows, so calling them cannot mint credit either."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest

from vidjobs.common import creation, credits, db, grants, ids
from vidjobs.common.credits import CreditRefused
from vidjobs.common.errors import QuotaExhausted, StoreError
from vidjobs.common.grants import GRANTS, SERVICES
from vidjobs.common.jobs import JobRequest
from vidjobs.gateway.accounts import create_account

WORKERS = tuple(s for s in SERVICES if s != "gateway")
BALANCE = 1000
ESTIMATE = 50


@asynccontextmanager
async def as_role(database_url: str, service: str) -> AsyncIterator[asyncpg.Connection]:
    """A session holding exactly the service role's privileges (the test's own user is a superuser, which may
    become any role)."""
    conn = await asyncpg.connect(database_url)
    try:
        await db.init_connection(conn)
        await conn.execute(f"SET ROLE {grants.role(service)}")
        yield conn
    finally:
        await conn.close()


async def _account(pool: asyncpg.Pool) -> str:
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "privileges", credits=BALANCE, concurrency=2)
    await pool.execute(
        "INSERT INTO webhook_endpoints (id, account_id, url, secret, events) VALUES ($1, $2, $3, $4, $5)",
        ids.new("we"), account_id, "https://example.com/hook", "whsec_c2VjcmV0c2VjcmV0c2VjcmV0", ["job.completed"])
    await pool.execute("UPDATE accounts SET webhook_secret = 'whsec_YWNjb3VudHNlY3JldA' WHERE id = $1", account_id)
    return account_id


async def _job(pool: asyncpg.Pool, account_id: str) -> str:
    async with pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id=account_id, request=JobRequest(model="fake/default", prompt="p"),
                                    estimated_credits=ESTIMATE, recovery_delay_s=600)
    return job.id


async def _credit(pool: asyncpg.Pool, account_id: str) -> tuple[int, int]:
    row = await pool.fetchrow("SELECT credits_balance, credits_reserved FROM accounts WHERE id = $1", account_id)
    return row["credits_balance"], row["credits_reserved"]


async def _ledger_explains(pool: asyncpg.Pool, account_id: str) -> bool:
    sums = await pool.fetchrow("SELECT sum(balance_change) AS b, sum(reserved_change) AS r FROM credit_ledger "
                               "WHERE account_id = $1", account_id)
    return (sums["b"], sums["r"]) == await _credit(pool, account_id)


@pytest.mark.parametrize("service", WORKERS)
async def test_a_worker_cannot_read_a_webhook_secret(pool, database_url, service):
    account_id = await _account(pool)
    refused = {}
    async with as_role(database_url, service) as conn:
        for statement in ("SELECT secret FROM webhook_endpoints", "SELECT webhook_secret FROM accounts",
                          "SELECT * FROM webhook_endpoints", "SELECT * FROM accounts"):
            try:
                await conn.fetch(statement)
                refused[statement] = None
            except asyncpg.PostgresError as exc:
                refused[statement] = type(exc)
        # What a transition asks of the table (does the account have a live endpoint?) is still answered.
        listens = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.account_id = $1 AND e.deleted_at IS NULL "
            "AND e.disabled_at IS NULL)", account_id)

    assert refused == dict.fromkeys(refused, asyncpg.InsufficientPrivilegeError)
    assert listens is True


async def test_a_secret_column_added_later_is_hidden_from_the_workers_without_a_new_grant(pool, database_url):
    await _account(pool)
    await pool.execute("ALTER TABLE webhook_endpoints ADD COLUMN secret_enc bytea")
    await pool.execute("ALTER TABLE accounts ADD COLUMN webhook_secret_enc bytea")
    async with pool.acquire() as admin:
        still_in_step = await grants.in_step(admin)

    refused = []
    for service in WORKERS:
        async with as_role(database_url, service) as conn:
            for statement in ("SELECT secret_enc FROM webhook_endpoints", "SELECT webhook_secret_enc FROM accounts"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.fetch(statement)
                refused.append((service, statement))
    async with as_role(database_url, "gateway") as conn:
        owner_reads = await conn.fetchval("SELECT count(secret_enc) FROM webhook_endpoints")

    assert still_in_step and len(refused) == 2 * len(WORKERS) and owner_reads == 0


@pytest.mark.parametrize("service", SERVICES)
async def test_no_service_changes_an_accounts_credit_by_hand(pool, database_url, service):
    account_id = await _account(pool)
    job_id = await _job(pool, account_id)
    before = await _credit(pool, account_id)
    attempts = (
        "UPDATE accounts SET credits_balance = credits_balance + 1000000",
        "UPDATE accounts SET credits_reserved = 0",
        f"INSERT INTO credit_ledger (account_id, kind, balance_change, reserved_change, balance_after, "
        f"reserved_after) VALUES ('{account_id}', 'grant', 1000000, 0, 1001000, 0)",
        "UPDATE account_daily_spend SET committed = 0",
        "DELETE FROM account_daily_spend",
    )
    refused = {}
    async with as_role(database_url, service) as conn:
        for statement in attempts:
            try:
                await conn.execute(statement)
                refused[statement] = None
            except asyncpg.PostgresError as exc:
                refused[statement] = type(exc)

    assert refused == dict.fromkeys(attempts, asyncpg.InsufficientPrivilegeError)
    assert await _credit(pool, account_id) == before == (BALANCE, ESTIMATE)
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE id = $1", job_id) == 1


async def _end_by_hand(conn: asyncpg.Connection, job_id: str, **columns: int) -> None:
    """What a worker's UPDATE on jobs can do to a job: end it, and write whatever figures it likes."""
    sets = "".join(f", {name} = {value}" for name, value in columns.items())
    await conn.execute(f"UPDATE jobs SET status = 'failed', recover_at = NULL, completed_at = now(){sets} "
                       "WHERE id = $1", job_id)


@pytest.mark.parametrize("service", WORKERS)
async def test_a_worker_cannot_mint_credit_through_the_credit_functions(pool, database_url, service):
    account_id = await _account(pool)
    live, negative, inflated, moved = [await _job(pool, account_id) for _ in range(4)]
    other = await _account(pool)
    refusals: dict[str, type | None] = {}

    async def attempt(conn: asyncpg.Connection, what: str, sql: str, *args) -> None:
        try:
            async with conn.transaction():
                await conn.fetch(sql, *args)
            refusals[what] = None
        except asyncpg.PostgresError as exc:
            refusals[what] = type(exc)

    settle = "SELECT * FROM settle_job_credit($1, 'note')"
    async with as_role(database_url, service) as conn:
        await attempt(conn, "settle a live job", settle, live)
        await attempt(conn, "settle a job that does not exist", settle, "job_nope")
        # Figures a worker can write on the job row: the reservation in the ledger bounds the settlement anyway.
        await _end_by_hand(conn, negative, actual_credits=-1_000_000, estimated_credits=-1_000_000)
        await attempt(conn, "settle a negative charge", settle, negative)
        await attempt(conn, "settle it again", settle, negative)
        await _end_by_hand(conn, inflated, actual_credits=1_000_000, estimated_credits=1_000_000)
        await attempt(conn, "settle a charge above the reservation", settle, inflated)
        await conn.execute("UPDATE jobs SET account_id = $2 WHERE id = $1", moved, other)
        await _end_by_hand(conn, moved, actual_credits=0)
        await attempt(conn, "settle a job moved to another account", settle, moved)
        await attempt(conn, "reserve", "SELECT * FROM reserve_job_credit($1, 'job_mine', -1000000)", account_id)
        await attempt(conn, "grant", "SELECT * FROM grant_credit($1, 1000000, 'mine')", account_id)

    assert refusals == {
        "settle a live job": asyncpg.InsufficientPrivilegeError,
        "settle a job that does not exist": asyncpg.InsufficientPrivilegeError,
        "settle a negative charge": None,  # settles, charging nothing
        "settle it again": asyncpg.InsufficientPrivilegeError,
        "settle a charge above the reservation": None,  # settles, charging the reservation
        "settle a job moved to another account": asyncpg.InsufficientPrivilegeError,
        "reserve": asyncpg.InsufficientPrivilegeError,  # no EXECUTE: only the gateway reserves
        "grant": asyncpg.InsufficientPrivilegeError,  # no EXECUTE: only the operator grants
    }
    # Two reservations are still held (live, moved); one was charged in full, one released.
    assert await _credit(pool, account_id) == (BALANCE - ESTIMATE, 2 * ESTIMATE)
    assert await _credit(pool, other) == (BALANCE, 0)
    assert await _ledger_explains(pool, account_id)


async def test_the_gateway_reserves_only_for_a_new_job_within_the_guardrails(pool, database_url):
    account_id = await _account(pool)
    existing = await _job(pool, account_id)
    refusals: dict[str, type | None] = {}
    reserve = "SELECT * FROM reserve_job_credit($1, $2, $3)"
    async with as_role(database_url, "gateway") as conn:
        for what, job_id, amount in (("a negative amount", "job_neg", -1_000_000),
                                     ("a job reserved already", existing, ESTIMATE),
                                     ("more than is free", "job_big", BALANCE),
                                     ("a new job", "job_new", ESTIMATE),
                                     ("the new job twice", "job_new", ESTIMATE)):
            try:
                async with conn.transaction():
                    await conn.fetch(reserve, account_id, job_id, amount)
                refusals[what] = None
            except asyncpg.PostgresError as exc:
                refusals[what] = type(exc)

    assert refusals == {
        "a negative amount": asyncpg.InsufficientPrivilegeError,
        "a job reserved already": asyncpg.InsufficientPrivilegeError,
        "more than is free": asyncpg.CheckViolationError,  # a guardrail: the API answers 402
        "a new job": None,
        "the new job twice": asyncpg.InsufficientPrivilegeError,
    }
    assert await _credit(pool, account_id) == (BALANCE, 2 * ESTIMATE)
    assert await _ledger_explains(pool, account_id)


async def test_the_credit_api_names_each_refusal(pool):
    account_id = await _account(pool)
    job_id = await _job(pool, account_id)
    refusals = (
        (CreditRefused, "has not ended", credits.settle, {"job_id": job_id, "note": "early"}),
        (CreditRefused, "not a new job", credits.reserve, {"account_id": account_id, "job_id": job_id, "amount": 1}),
        (QuotaExhausted, f"has {BALANCE - ESTIMATE} free", credits.reserve,
         {"account_id": account_id, "job_id": "job_big", "amount": BALANCE}),
        (StoreError, "no account", credits.reserve, {"account_id": "acct_nope", "job_id": "job_x", "amount": 1}),
    )
    async with pool.acquire() as conn:
        for error, words, call, arguments in refusals:
            with pytest.raises(error, match=words):
                async with conn.transaction():
                    await call(conn, **arguments)

    assert await _credit(pool, account_id) == (BALANCE, ESTIMATE)


async def test_grants_put_back_a_column_or_function_privilege_changed_by_hand(pool):
    drift = (
        "GRANT SELECT (secret) ON webhook_endpoints TO vidjobs_media",
        "GRANT UPDATE (credits_balance) ON accounts TO vidjobs_gateway",
        "GRANT EXECUTE ON FUNCTION reserve_job_credit TO vidjobs_reaper",
        "REVOKE EXECUTE ON FUNCTION settle_job_credit FROM vidjobs_poller",
        "GRANT EXECUTE ON FUNCTION settle_job_credit TO PUBLIC",
        "GRANT CREATE ON SCHEMA public TO vidjobs_submitter",
        "GRANT CREATE ON SCHEMA public TO PUBLIC",
    )
    seen = {}
    async with pool.acquire() as admin:
        for statement in drift:
            await admin.execute(statement)
            seen[statement] = await grants.in_step(admin)
            assert await grants.apply(admin)
        held = await grants.held(admin)
        in_step = await grants.in_step(admin)

    assert seen == dict.fromkeys(drift, False)
    assert held == GRANTS and in_step
    # The functions that run as the schema's owner resolve what they call in the schema: no role adds to it.
    async with pool.acquire() as admin:
        assert await grants.may_create(admin) == []


async def test_the_functions_a_service_calls_run_as_their_owner_on_a_pinned_search_path(pool):
    rows = await pool.fetch(
        """
        SELECT p.proname, p.prosecdef, p.proconfig,
               pg_get_userbyid(p.proowner) = (SELECT pg_get_userbyid(relowner) FROM pg_class
                                              WHERE oid = 'jobs'::regclass) AS schema_owners,
               has_function_privilege('public', p.oid, 'EXECUTE') AS public_executes
        FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef
        """)
    declared = {name for service in SERVICES for name, privileges in GRANTS[service].items()
                if grants.Privilege.EXECUTE in privileges}
    schema = await pool.fetchval("SELECT current_schema()")

    assert {r["proname"] for r in rows} == declared == {"reserve_job_credit", "settle_job_credit", "reprice_job_credit",
                                                        "platform_credit", "purge_closed_account",
                                                        "mark_upload_ready", "mark_upload_rejected",
                                                        "expire_unused_uploads", "reject_unprocessed_uploads"}
    for row in rows:
        assert row["schema_owners"] and not row["public_executes"], dict(row)
        assert row["proconfig"] == [f"search_path={schema}, pg_temp"], dict(row)


async def test_the_submitter_can_only_lower_a_waiting_jobs_reservation(pool, database_url):
    """A move to a cheaper fallback lowers the reservation (reprice_job_credit); nothing can raise it, lower a
    job that is not waiting, or lower it below zero, and the settlement charges within what is left."""
    account_id = await _account(pool)
    waiting, ended = await _job(pool, account_id), await _job(pool, account_id)
    refusals: dict[str, type | None] = {}
    reprice = "SELECT * FROM reprice_job_credit($1, $2, 'moved')"
    async with as_role(database_url, "submitter") as conn:
        await _end_by_hand(conn, ended, actual_credits=0)
        for what, job_id, amount in (("raise it", waiting, ESTIMATE + 1), ("below zero", waiting, -1),
                                     ("a job that ended", ended, 1), ("no such job", "job_nope", 1),
                                     ("lower it", waiting, ESTIMATE - 10), ("lower it again", waiting, ESTIMATE - 20),
                                     ("raise it back", waiting, ESTIMATE - 10)):
            try:
                async with conn.transaction():
                    await conn.fetch(reprice, job_id, amount)
                refusals[what] = None
            except asyncpg.PostgresError as exc:
                refusals[what] = type(exc)
        await _end_by_hand(conn, waiting, actual_credits=1_000_000)
        await conn.fetch("SELECT * FROM settle_job_credit($1, 'done')", waiting)
    async with as_role(database_url, "poller") as conn:
        try:
            await conn.fetch(reprice, waiting, 0)
            refusals["as another worker"] = None
        except asyncpg.PostgresError as exc:
            refusals["as another worker"] = type(exc)

    denied = asyncpg.InsufficientPrivilegeError
    assert refusals == {"raise it": denied, "below zero": denied, "a job that ended": denied, "no such job": denied,
                        "lower it": None, "lower it again": None, "raise it back": denied,
                        "as another worker": denied}
    # Charged at most the lowered reservation; the ended job's reservation is still held (never settled here).
    assert await _credit(pool, account_id) == (BALANCE - (ESTIMATE - 20), ESTIMATE)
    assert await _ledger_explains(pool, account_id)
