"""An account's webhook endpoints as it sees them (through its Tenant): registering, listing and removing
them, what was delivered to each, and sending a delivery again."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import ids
from vidjobs.gateway.appwebhooks import secrets
from vidjobs.gateway.sealing import Keyring


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
                       description: str) -> tuple[Endpoint, str]:
    """The endpoint and its secret, shown this once: the row holds it sealed."""
    endpoint_id = new_endpoint_id()
    secret, sealed = secrets.sealed_new(ring, secrets.ENDPOINT, endpoint_id)
    row = await pool.fetchrow(
        f"INSERT INTO webhook_endpoints (id, account_id, url, secret_sealed, events, description) "
        f"VALUES ($1, $2, $3, $4, $5, $6) RETURNING {_ENDPOINT_COLUMNS}",
        endpoint_id, account_id, url, sealed, events, description)
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


class Attempt(msgspec.Struct, kw_only=True):
    at: datetime
    status: int | None
    error: str | None
    ms: int


class DeliveryView(msgspec.Struct, kw_only=True):
    id: str
    job_id: str
    event_type: str
    status: str
    next_attempt_at: datetime | None
    created_at: datetime
    attempts: list[Attempt]


async def endpoint_deliveries(pool: asyncpg.Pool, account_id: str, endpoint_id: str,
                              limit: int) -> list[DeliveryView] | None:
    """Newest first, each with its attempts; None when the account has no such endpoint."""
    owned = await pool.fetchval("SELECT true FROM webhook_endpoints WHERE id = $1 AND account_id = $2 "
                                "AND deleted_at IS NULL", endpoint_id, account_id)
    if not owned:
        return None
    rows = await pool.fetch(
        """
        SELECT d.id, d.job_id, d.event_type, d.status, d.next_attempt_at, d.created_at,
               COALESCE((SELECT jsonb_agg(jsonb_build_object('at', a.at, 'status', a.status, 'error', a.error,
                                                             'ms', a.ms) ORDER BY a.id)
                         FROM webhook_attempts a WHERE a.delivery_id = d.id), '[]') AS attempts
        FROM webhook_deliveries d WHERE d.endpoint_id = $1
        ORDER BY d.created_at DESC, d.id DESC LIMIT $2
        """, endpoint_id, limit)
    return [msgspec.convert(dict(r), DeliveryView, strict=False) for r in rows]


async def retry_delivery(pool: asyncpg.Pool, account_id: str, endpoint_id: str, delivery_id: str) -> bool:
    """Send a delivery again now, whatever became of it, while its endpoint is enabled. Past its schedule, it
    gets this one attempt."""
    status = await pool.execute(
        """
        UPDATE webhook_deliveries d SET status = 'pending', next_attempt_at = clock_timestamp(),
            updated_at = clock_timestamp()
        FROM webhook_endpoints e
        WHERE d.id = $3 AND d.endpoint_id = $2 AND e.id = d.endpoint_id AND e.account_id = $1
          AND e.deleted_at IS NULL AND e.disabled_at IS NULL
        """, account_id, endpoint_id, delivery_id)
    return status.endswith(" 1")
