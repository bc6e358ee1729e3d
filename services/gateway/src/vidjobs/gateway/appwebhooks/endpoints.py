"""An account's webhook endpoints as it sees them (through its Tenant): registering, listing and removing
them. What was delivered to each, and sending a delivery again, is history.py."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import ids
from vidjobs.gateway.appwebhooks import secrets
from vidjobs.gateway.sealing import Keyring


class CapReached(Exception):
    """One of the account's webhook caps is reached; the message says which and what to do."""


def new_endpoint_id() -> str:
    return ids.new("whe")


class Endpoint(msgspec.Struct, kw_only=True):
    id: str
    url: str
    events: list[str]
    description: str
    created_at: datetime
    disabled_at: datetime | None
    disabled_reason: str | None
    secret_created_at: datetime
    previous_secret_expires_at: datetime | None  # while a rotated-out secret still signs


_ENDPOINT_COLUMNS = ("id, url, events, description, created_at, disabled_at, disabled_reason, secret_created_at, "
                     "CASE WHEN previous_secret_expires_at > clock_timestamp() THEN previous_secret_expires_at END "
                     "AS previous_secret_expires_at")


async def add_endpoint(pool: asyncpg.Pool, ring: Keyring, account_id: str, url: str, events: list[str],
                       description: str, *, cap: int) -> tuple[Endpoint, str]:
    """The endpoint and its secret, shown this once (the row holds it sealed), unless the account has `cap`
    already (CapReached). One account's registrations are decided one at a time (a transaction-scoped lock),
    so racing ones never pass the cap."""
    endpoint_id = new_endpoint_id()
    secret, sealed = secrets.sealed_new(ring, secrets.ENDPOINT, endpoint_id)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('webhook-endpoints:' || $1))", account_id)
        if await conn.fetchval("SELECT count(*) FROM webhook_endpoints WHERE account_id = $1 "
                               "AND deleted_at IS NULL", account_id) >= cap:
            raise CapReached(f"this account has {cap} webhook endpoints, the most it may have: delete one it no "
                             "longer uses (DELETE /v1/webhook-endpoints/{id}), or have one endpoint hear "
                             "several kinds of event")
        row = await conn.fetchrow(
            f"INSERT INTO webhook_endpoints (id, account_id, url, secret_sealed, events, description) "
            f"VALUES ($1, $2, $3, $4, $5, $6) RETURNING {_ENDPOINT_COLUMNS}",
            endpoint_id, account_id, url, sealed, events, description)
    assert row is not None  # an INSERT ... RETURNING answers its row
    return msgspec.convert(dict(row), Endpoint), secret


async def endpoints(pool: asyncpg.Pool, account_id: str) -> list[Endpoint]:
    rows = await pool.fetch(f"SELECT {_ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE account_id = $1 "
                            "AND deleted_at IS NULL ORDER BY created_at, id", account_id)
    return [msgspec.convert(dict(r), Endpoint) for r in rows]


async def remove_endpoint(pool: asyncpg.Pool, account_id: str, endpoint_id: str) -> bool:
    """Nothing more is sent to it: its waiting deliveries are dropped with it."""
    async with pool.acquire() as conn, conn.transaction():
        status = await conn.execute("UPDATE webhook_endpoints SET deleted_at = clock_timestamp() "
                                    "WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL", endpoint_id, account_id)
        await conn.execute("UPDATE webhook_deliveries SET status = 'disabled', next_attempt_at = NULL "
                           "WHERE endpoint_id = $1 AND status = 'pending'", endpoint_id)
    return status.endswith(" 1")
