"""Accounts, API keys and credit reservations (tables the gateway owns).

An API key is shown once, when it is made, and stored only as its SHA-256: a leaked database does not leak
keys. The CLI imports `create_account` and `add_api_key`, so this module starts nothing on import.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import ids
from vidjobs.common.credits import grant
from vidjobs.common.errors import StoreError
from vidjobs.common.states import SQL_TERMINAL, TERMINAL

KEY_PREFIX = "vj_"


class Account(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    concurrent_jobs: int
    credits_balance: int
    credits_reserved: int
    daily_spend_cap: int | None = None  # credits committed per UTC day; None: no cap
    max_job_credits: int | None = None  # the most one job may be estimated at; None: no maximum
    requests_per_s: float | None = None  # API requests per second per key; None: the platform default
    request_burst: int | None = None
    fallback_models: list[str] = []  # tried in order when a job that names none must move (failover)
    storage_quota_bytes: int | None = None  # what its kept clips may hold; None: the platform default
    max_queued_jobs: int | None = None  # its jobs waiting for a slot; None: the platform default
    platform_id: str | None = None  # the platform that made it through the API; None: the operator did
    external_id: str | None = None  # that platform's own id of its user
    plan: str | None = None  # the platform's plan its limits are copied from; None: limits of its own
    disabled_at: datetime | None = None  # disabled by its platform: it may read, not create


def columns(alias: str = "") -> str:
    """The accounts columns an `Account` is read from, for a SELECT or RETURNING list (`alias.` prefixed)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + name for name in Account.__struct_fields__)


def account_of(row: asyncpg.Record) -> Account:
    """The `Account` in a row that holds `columns()` (and possibly more)."""
    return Account(**{name: row[name] for name in Account.__struct_fields__})


_COLUMNS = columns()


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


async def create_account(
    conn: asyncpg.Connection, name: str, *, credits: int, concurrency: int, daily_spend_cap: int | None = None,
    max_job_credits: int | None = None, requests_per_s: float | None = None, request_burst: int | None = None,
    storage_quota_bytes: int | None = None,
) -> tuple[str, str]:
    """A new account with its opening credit (a ledger entry) and limits; returns (account_id, api_key)."""
    account_id = ids.new("acct")
    key = new_api_key()
    async with conn.transaction():
        await conn.execute(
            """
            INSERT INTO accounts (id, name, concurrent_jobs, daily_spend_cap, max_job_credits, requests_per_s,
                                  request_burst)
            VALUES ($1, $2, $3, $4, $5, $6, $7)
            """,
            account_id, name, concurrency, daily_spend_cap, max_job_credits, requests_per_s, request_burst,
        )
        if storage_quota_bytes is not None:
            # Set apart, so an account without a quota of its own can be made on a schema before 0024.
            await conn.execute("UPDATE accounts SET storage_quota_bytes = $2 WHERE id = $1", account_id,
                               storage_quota_bytes)
        if credits:
            await grant(conn, account_id, credits, "opening credit")
        await add_api_key(conn, account_id, key)
    return account_id, key


async def add_api_key(conn: asyncpg.Connection, account_id: str, key: str) -> None:
    """Register a known key for an account. Registering the same key again is a no-op; a key that already
    belongs to another account is refused."""
    inserted = await conn.fetchval(
        """
        INSERT INTO api_keys (id, account_id, key_hash, prefix) VALUES ($1, $2, $3, $4)
        ON CONFLICT ON CONSTRAINT api_keys_hash_unique DO NOTHING
        RETURNING id
        """,
        ids.new("key"), account_id, hash_key(key), key[:8],
    )
    if inserted is None:
        owner = await conn.fetchval("SELECT account_id FROM api_keys WHERE key_hash = $1", hash_key(key))
        if owner != account_id:
            raise StoreError("this API key is already registered to another account")


async def by_key(conn: asyncpg.Connection | asyncpg.Pool, key: str) -> Account | None:
    """The account a live (unrevoked) key belongs to."""
    row = await conn.fetchrow(
        f"""
        SELECT {columns("a")} FROM api_keys k JOIN accounts a ON a.id = k.account_id
        WHERE k.key_hash = $1 AND k.revoked_at IS NULL
        """,
        hash_key(key),
    )
    return None if row is None else account_of(row)


async def fetch(conn: asyncpg.Connection | asyncpg.Pool, account_id: str) -> Account | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM accounts WHERE id = $1",
        account_id,
    )
    return None if row is None else Account(**dict(row))


async def active_jobs(conn: asyncpg.Connection | asyncpg.Pool, account_id: str) -> int:
    return int(await conn.fetchval(
        f"""
        SELECT count(*) FROM jobs
        WHERE account_id = $1 AND deleted_at IS NULL
          AND status NOT IN {SQL_TERMINAL}
        """,
        account_id,
    ))


class AccountSummary(Account, frozen=True, kw_only=True):
    """An account as an operator lists it."""

    live_keys: int  # unrevoked API keys
    active_jobs: int  # jobs not yet in a terminal status, and not deleted


class KeyInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as an operator sees it: never the key, never its hash."""

    id: str
    account_id: str
    name: str
    prefix: str  # the key's first 8 characters, enough to recognise it
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


# Limits an operator may change (`update_limits`), each an `accounts` column.
LIMITS = frozenset({"concurrent_jobs", "daily_spend_cap", "max_job_credits", "requests_per_s", "request_burst",
                    "storage_quota_bytes", "max_queued_jobs"})


async def list_accounts(conn: asyncpg.Connection | asyncpg.Pool) -> list[AccountSummary]:
    rows = await conn.fetch(
        f"""
        SELECT {_COLUMNS},
               (SELECT count(*) FROM api_keys k WHERE k.account_id = a.id AND k.revoked_at IS NULL) AS live_keys,
               (SELECT count(*) FROM jobs j WHERE j.account_id = a.id AND j.deleted_at IS NULL
                  AND j.status <> ALL($1::job_status[])) AS active_jobs
        FROM accounts a ORDER BY a.created_at, a.id
        """,
        [s.value for s in TERMINAL],
    )
    return [AccountSummary(**dict(r)) for r in rows]


async def update_limits(
    conn: asyncpg.Connection | asyncpg.Pool, account_id: str, **changes: int | float | None,
) -> Account | None:
    """Set the named limits (columns in LIMITS; None clears a cap); None if there is no such account."""
    if unknown := set(changes) - LIMITS:
        raise ValueError(f"not account limits: {', '.join(sorted(unknown))}")
    if not changes:
        return await fetch(conn, account_id)
    columns = sorted(changes)  # names from LIMITS only, so safe to place in the statement
    assignments = ", ".join(f"{column} = ${i}" for i, column in enumerate(columns, start=2))
    try:
        row = await conn.fetchrow(f"UPDATE accounts SET {assignments} WHERE id = $1 RETURNING {_COLUMNS}",
                                  account_id, *(changes[c] for c in columns))
    except asyncpg.CheckViolationError as exc:
        raise StoreError(f"a limit is out of range ({exc.constraint_name}); see `vidjobs accounts set -h`") from exc
    return None if row is None else Account(**dict(row))


async def create_key(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, name: str = "") -> tuple[str, str]:
    """A new API key for an existing account; returns (key_id, key). Only the key's hash is stored."""
    key_id, key = ids.new("key"), new_api_key()
    try:
        await conn.execute(
            "INSERT INTO api_keys (id, account_id, key_hash, prefix, name) VALUES ($1, $2, $3, $4, $5)",
            key_id, account_id, hash_key(key), key[:8], name,
        )
    except asyncpg.ForeignKeyViolationError as exc:
        raise StoreError(f"no account {account_id!r}; `vidjobs accounts list` shows the accounts") from exc
    return key_id, key


async def list_keys(conn: asyncpg.Connection | asyncpg.Pool, account_id: str) -> list[KeyInfo]:
    rows = await conn.fetch(
        """
        SELECT id, account_id, name, prefix, created_at, last_used_at, revoked_at FROM api_keys
        WHERE account_id = $1 ORDER BY created_at, id
        """,
        account_id,
    )
    return [KeyInfo(**dict(r)) for r in rows]


async def revoke_key(conn: asyncpg.Connection | asyncpg.Pool, key_id: str) -> bool | None:
    """Revoke a key at once: True if this call revoked it, False if it already was, None if there is none."""
    if await conn.fetchval(
        "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING id", key_id,
    ) is not None:
        return True
    exists = await conn.fetchval("SELECT true FROM api_keys WHERE id = $1", key_id)
    return False if exists else None
