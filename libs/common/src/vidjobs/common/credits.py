"""Credits: every change of an account's balance or reservation, each written with its ledger entry.

A job's estimate is reserved when it is created, under the account's row lock and against its guardrails
(free credit, the per-job maximum, the daily spend cap), so racing requests can never overspend. When the
job ends the reservation is released, and what is owed is charged: a delivered render, or a failed or
canceled one the provider billed for. A charge never exceeds the estimate: the estimate is the quote. What
the provider billed beyond the charge (every attempt's render is billed, the charge is for the one at hand)
the platform absorbs: the settlement enters it as an `absorb` entry that moves no credit (attempt_costs).

The changes themselves are PostgreSQL functions (migration 0014_credit_functions.sql): no service may write
an account's credit, the ledger or the day's spend directly (vidjobs.common.grants). The gateway may call
`reserve_job_credit` and every service `settle_job_credit`; they run as the schema's owner and do only
what reserving for a new job and settling an ended one do, so a service that misbehaves cannot add credit.
Each changes the account and appends the ledger entry in one statement, so the two cannot disagree, and
locks the account's row before the day's spend row, so reservations and settlements racing on one account
queue up instead of deadlocking. The row lock is FOR NO KEY UPDATE: it serializes changes of credit without
blocking the inserts of rows that merely reference the account (jobs, ledger entries).
"""

from __future__ import annotations

import enum
from datetime import date, datetime

import asyncpg
import msgspec

from vidjobs.common.errors import QuotaExhausted, StoreError
from vidjobs.common.jobs import JobRow
from vidjobs.common.states import JobStatus


class LedgerKind(enum.StrEnum):
    OPENING = "opening"  # the balance an account had before the ledger existed
    GRANT = "grant"  # credit added (or, negative, taken back) by an operator
    RESERVE = "reserve"  # a new job's estimate is held
    RELEASE = "release"  # a job ended without a charge; its estimate is free again
    CHARGE = "charge"  # a job ended and was billed; its estimate is released and the charge paid
    REPRICE = "reprice"  # a waiting job moved to a cheaper model; the difference is free again
    # The provider billed more for a job than it was charged (retried attempts, a bill above the estimate): the
    # platform paid it. Moves no credit; `absorbed` says how much. Written by the settlement (migration 0023).
    ABSORB = "absorb"


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    account_id: str
    job_id: str | None
    kind: LedgerKind
    balance_change: int
    reserved_change: int
    balance_after: int
    reserved_after: int
    note: str
    at: datetime
    absorbed: int = 0  # on an absorb entry: credits the provider billed beyond the charge


class CreditRefused(StoreError):
    """A credit function refused a change that reserving for a new job or settling an ended one never makes
    (a second settlement, a job that has not ended, a negative estimate): a bug, or a misbehaving caller."""


# The constraint a guardrail refusal names (reserve_job_credit): the account cannot take this job now.
GUARDRAILS = "credit_guardrails"


def _entry(row: asyncpg.Record | None, account_id: str) -> Entry:
    # A function answering for an account that does not exist answers an empty row.
    if row is None or row["id"] is None:
        raise StoreError(f"no account {account_id!r}")
    return msgspec.convert(dict(row), Entry)


# A day is a UTC date; None is the database's today.
_DAY = "COALESCE($2::date, (now() AT TIME ZONE 'UTC')::date)"


async def committed_on(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, day: date | None = None) -> int:
    """Credit committed on `day`: estimates of that day's jobs while held, then what they cost."""
    value = await conn.fetchval(
        f"SELECT committed FROM account_daily_spend WHERE account_id = $1 AND day = {_DAY}", account_id, day)
    return value or 0


async def reserve(conn: asyncpg.Connection, *, account_id: str, job_id: str, amount: int) -> Entry:
    """Hold `amount` credits for a new job, if the account's guardrails allow it (the daily cap counts
    today's jobs). Call inside the transaction that creates the job, before the job's row; the account row
    stays locked until it commits, so requests racing for the last credits are decided one at a time.
    Raises QuotaExhausted, and the transaction is then spent: it must roll back, creating nothing."""
    try:
        row = await conn.fetchrow("SELECT * FROM reserve_job_credit($1, $2, $3)", account_id, job_id, amount)
    except asyncpg.CheckViolationError as exc:
        if exc.constraint_name != GUARDRAILS:
            raise
        raise QuotaExhausted(exc.message) from exc
    except asyncpg.InsufficientPrivilegeError as exc:
        raise CreditRefused(exc.message) from exc
    return _entry(row, account_id)


async def settle(conn: asyncpg.Connection, *, job_id: str, note: str) -> Entry:
    """A job ended (its terminal status is written in this transaction): release its
    reservation and charge its `actual_credits`, never more than was reserved. Raises CreditRefused if the
    job holds no reservation, is settled already, or has not ended."""
    try:
        row = await conn.fetchrow("SELECT * FROM settle_job_credit($1, $2)", job_id, note)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise CreditRefused(exc.message) from exc
    assert row is not None, "settle_job_credit answers one row or raises"
    return msgspec.convert(dict(row), Entry)


async def grant(conn: asyncpg.Connection, account_id: str, amount: int, note: str = "") -> Entry:
    """Add credit (a negative amount takes unreserved credit back); the operator's, as the schema's owner.
    Raises StoreError if that would leave less than the account has reserved for running jobs."""
    try:
        async with conn.transaction():
            row = await conn.fetchrow("SELECT * FROM grant_credit($1, $2, $3)", account_id, amount,
                                      note or ("credit granted" if amount >= 0 else "credit withdrawn"))
    except asyncpg.CheckViolationError as exc:
        raise StoreError(f"cannot take back {-amount} credits: that would leave less than the account has "
                         "reserved for running jobs") from exc
    return _entry(row, account_id)


async def entries(
    conn: asyncpg.Connection | asyncpg.Pool, account_id: str, *, before_id: int | None = None, limit: int = 100,
) -> list[Entry]:
    """The account's ledger, newest first, strictly before `before_id`."""
    rows = await conn.fetch(
        """
        SELECT * FROM credit_ledger WHERE account_id = $1 AND ($2::bigint IS NULL OR id < $2)
        ORDER BY id DESC LIMIT $3
        """,
        account_id, before_id, limit,
    )
    return [msgspec.convert(dict(r), Entry) for r in rows]


def settle_note(ending: str, job_id: str, estimated: int, charged: int, provider_cost: int | None, *,
                rendered: bool = False) -> str:
    """Why a job's credit moved as it did, for the ledger. `ending`: its terminal status;
    `rendered`: the provider had finished the render when the job ended."""
    reported = bool(provider_cost)  # a cost of 0 is no report: the estimate stands in
    source = "the provider's reported cost" if reported else "the estimate"
    capped = " (capped at the estimate)" if provider_cost and provider_cost > estimated else ""
    if ending == JobStatus.COMPLETED:
        return f"{job_id} completed: charged {charged} from {source}{capped}"
    if rendered:
        return f"{job_id} {ending} after the provider rendered it: charged {charged} from {source}{capped}"
    if charged:
        return f"{job_id} {ending}: the provider billed {provider_cost}, charged {charged}"
    return f"{job_id} {ending}: nothing billed, estimate of {estimated} released"


def owed_sql(delivered: str, rendered: str = "false") -> str:
    """SQL for what a job ending now owes, kept as its `actual_credits` beside its estimate. `delivered` and
    `rendered` are SQL conditions. A delivered render, or one the provider finished before the owner ended
    the job (`rendered`), costs the provider's reported cost where it gave one, else the estimate: a cost of
    0 is no report, since nothing renders for free. Any other ending costs what the provider billed for the
    attempt at hand, if anything. Never more than the estimate: the estimate is the quote the credit was
    reserved for."""
    return f"""GREATEST(0, LEAST(estimated_credits, CASE WHEN ({delivered}) OR ({rendered})
        THEN COALESCE(NULLIF(provider_cost_credits, 0), estimated_credits)
        ELSE COALESCE(provider_cost_credits, 0) END))"""


async def settle_credit(conn: asyncpg.Connection, job: JobRow, ending: str, *, rendered: bool = False) -> None:
    """A job just ended (`ending`: its terminal status): release its reservation and charge its
    `actual_credits`, with a ledger entry saying why. `rendered`: the provider had finished the render.
    `job` is the row as this transaction just wrote it: the settlement reads the same figures."""
    charged = max(0, min(job.actual_credits or 0, job.estimated_credits))
    await settle(conn, job_id=job.id, note=settle_note(
        ending, job.id, job.estimated_credits, charged, job.provider_cost_credits, rendered=rendered))
