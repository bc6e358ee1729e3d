"""Credits: every change of an account's balance or reservation, each written with its ledger entry.

A job's estimate is reserved when it is created, under the account's row lock and against its guardrails
(free credit, the per-job maximum, the daily spend cap), so racing requests can never overspend. When the
job ends the reservation is released, and what is owed is charged: a delivered render, or a failed or
canceled one the provider billed for. A charge never exceeds the estimate: the estimate is the quote.

`_apply` changes the account and appends the ledger entry in one statement, so the two cannot disagree.

Every change locks the account's row before the day's spend row, so reservations and settlements racing on
one account queue up instead of deadlocking. The row lock is FOR NO KEY UPDATE: it serializes changes of
credit without blocking the inserts of rows that merely reference the account (jobs, ledger entries).
"""

from __future__ import annotations

import enum
from datetime import date, datetime

import asyncpg
import msgspec

from vidjobs.common.errors import QuotaExhausted, StoreError
from vidjobs.common.states import JobStatus


class LedgerKind(enum.StrEnum):
    OPENING = "opening"  # the balance an account had before the ledger existed
    GRANT = "grant"  # credit added (or, negative, taken back) by an operator
    RESERVE = "reserve"  # a new job's estimate is held
    RELEASE = "release"  # a job ended without a charge; its estimate is free again
    CHARGE = "charge"  # a job ended and was billed; its estimate is released and the charge paid


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


class Guardrails(msgspec.Struct, frozen=True, kw_only=True):
    balance: int
    reserved: int
    daily_spend_cap: int | None
    max_job_credits: int | None


async def _apply(
    conn: asyncpg.Connection, account_id: str, kind: LedgerKind, *, balance: int, reserved: int,
    job_id: str | None = None, note: str = "",
) -> Entry:
    row = await conn.fetchrow(
        """
        WITH moved AS (
            UPDATE accounts SET credits_balance = credits_balance + $3, credits_reserved = credits_reserved + $4
            WHERE id = $1
            RETURNING id, credits_balance, credits_reserved
        )
        INSERT INTO credit_ledger (account_id, job_id, kind, balance_change, reserved_change,
                                   balance_after, reserved_after, note)
        SELECT moved.id, $5, $2::ledger_kind, $3, $4, moved.credits_balance, moved.credits_reserved, $6 FROM moved
        RETURNING *
        """,
        account_id, kind.value, balance, reserved, job_id, note,
    )
    if row is None:
        raise StoreError(f"no account {account_id!r}")
    return msgspec.convert(dict(row), Entry)


async def _lock(conn: asyncpg.Connection, account_id: str) -> Guardrails:
    row = await conn.fetchrow(
        """
        SELECT credits_balance AS balance, credits_reserved AS reserved, daily_spend_cap, max_job_credits
        FROM accounts WHERE id = $1 FOR NO KEY UPDATE
        """,
        account_id,
    )
    if row is None:
        raise StoreError(f"no account {account_id!r}")
    return Guardrails(**dict(row))


# A day is a UTC date; None is the database's today, the day of a job created in this transaction (its
# `created_at` is the transaction's `now()` too).
_DAY = "COALESCE($2::date, (now() AT TIME ZONE 'UTC')::date)"


async def committed_on(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, day: date | None = None) -> int:
    """Credit committed on `day`: estimates of that day's jobs while held, then what they cost."""
    value = await conn.fetchval(
        f"SELECT committed FROM account_daily_spend WHERE account_id = $1 AND day = {_DAY}", account_id, day)
    return value or 0


async def _commit_day(conn: asyncpg.Connection, account_id: str, day: date | None, amount: int) -> None:
    await conn.execute(
        f"""
        INSERT INTO account_daily_spend AS d (account_id, day, committed) VALUES ($1, {_DAY}, $3)
        ON CONFLICT (account_id, day) DO UPDATE SET committed = d.committed + $3
        """,
        account_id, day, amount,
    )


async def reserve(conn: asyncpg.Connection, *, account_id: str, job_id: str, amount: int) -> Entry:
    """Hold `amount` credits for a new job, if the account's guardrails allow it (the daily cap counts
    today's jobs). Call inside the transaction that creates the job; the account row stays locked until it
    commits, so requests racing for the last credits are decided one at a time. Raises QuotaExhausted,
    creating nothing."""
    account = await _lock(conn, account_id)
    if account.max_job_credits is not None and amount > account.max_job_credits:
        raise QuotaExhausted(f"this job is estimated at {amount} credits, above the account's per-job maximum "
                             f"of {account.max_job_credits}; choose a shorter or lower-resolution render")
    if account.daily_spend_cap is not None:
        spent = await committed_on(conn, account_id)
        if spent + amount > account.daily_spend_cap:
            raise QuotaExhausted(f"this job needs {amount} credits and {spent} of today's cap of "
                                 f"{account.daily_spend_cap} are committed; the cap resets at 00:00 UTC")
    free = account.balance - account.reserved
    if free < amount:
        raise QuotaExhausted(f"this job needs {amount} credits and the account has {max(free, 0)} free; "
                             "add credit or wait for running jobs to finish")
    await _commit_day(conn, account_id, None, amount)
    return await _apply(conn, account_id, LedgerKind.RESERVE, balance=0, reserved=amount, job_id=job_id,
                        note=f"estimate for {job_id}")


async def settle(
    conn: asyncpg.Connection, *, account_id: str, job_id: str, estimated: int, charged: int, day: date,
    note: str,
) -> Entry:
    """A job ended: release its reservation and pay `charged` (at most the estimate) from the balance."""
    if not 0 <= charged <= estimated:
        raise ValueError(f"charge {charged} is outside 0..{estimated}")
    kind = LedgerKind.CHARGE if charged else LedgerKind.RELEASE
    entry = await _apply(conn, account_id, kind, balance=-charged, reserved=-estimated, job_id=job_id, note=note)
    await _commit_day(conn, account_id, day, charged - estimated)  # after the account row, as `reserve` does
    return entry


async def grant(conn: asyncpg.Connection, account_id: str, amount: int, note: str = "") -> Entry:
    """Add credit (a negative amount takes unreserved credit back). Raises StoreError if that would leave
    less than the account has reserved for running jobs."""
    try:
        async with conn.transaction():
            return await _apply(conn, account_id, LedgerKind.GRANT, balance=amount, reserved=0,
                                note=note or ("credit granted" if amount >= 0 else "credit withdrawn"))
    except asyncpg.CheckViolationError as exc:
        raise StoreError(f"cannot take back {-amount} credits: that would leave less than the account has "
                         "reserved for running jobs") from exc


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
    """Why a job's credit moved as it did, for the ledger. `ending`: its terminal status, or "deleted";
    `rendered`: the provider had finished the render when the job ended."""
    reported = bool(provider_cost)  # a cost of 0 is no report: the estimate stands in
    source = "the provider's reported cost" if reported else "the estimate"
    capped = " (capped at the estimate)" if reported and provider_cost > estimated else ""
    if ending == JobStatus.COMPLETED:
        return f"{job_id} completed: charged {charged} from {source}{capped}"
    if rendered:
        return f"{job_id} {ending} after the provider rendered it: charged {charged} from {source}{capped}"
    if charged:
        return f"{job_id} {ending}: the provider billed {provider_cost}, charged {charged}"
    return f"{job_id} {ending}: nothing billed, estimate of {estimated} released"
