"""What was delivered to an account's webhook endpoint, as the account sees it (through its Tenant), and
sending one of those deliveries again by hand."""

from __future__ import annotations

import enum
from datetime import datetime

import asyncpg
import msgspec


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
    attempt_count: int
    attempts: list[Attempt]  # the last ATTEMPTS_SHOWN, oldest first


ATTEMPTS_SHOWN = 10

# A page of deliveries, each with its last few attempts: an answer's size is bounded by the page, whatever
# an endpoint's history.
_DELIVERIES = f"""
SELECT d.id, d.job_id, d.event_type, d.status, d.next_attempt_at, d.created_at, d.attempts AS attempt_count,
       COALESCE((SELECT jsonb_agg(jsonb_build_object('at', a.at, 'status', a.status, 'error', a.error, 'ms', a.ms)
                                  ORDER BY a.id)
                 FROM (SELECT * FROM webhook_attempts WHERE delivery_id = d.id ORDER BY id DESC
                       LIMIT {ATTEMPTS_SHOWN}) a), '[]') AS attempts
FROM webhook_deliveries d
WHERE d.endpoint_id = $1 AND ($3::timestamptz IS NULL OR (d.created_at, d.id) < ($3, $4))
ORDER BY d.created_at DESC, d.id DESC LIMIT $2
"""


async def endpoint_deliveries(pool: asyncpg.Pool, account_id: str, endpoint_id: str, limit: int,
                              before: tuple[datetime, str] | None = None) -> list[DeliveryView] | None:
    """Newest first, strictly before `before` (created_at, id); None when the account has no such endpoint."""
    owned = await pool.fetchval("SELECT true FROM webhook_endpoints WHERE id = $1 AND account_id = $2 "
                                "AND deleted_at IS NULL", endpoint_id, account_id)
    if not owned:
        return None
    at, after_id = before or (None, None)
    rows = await pool.fetch(_DELIVERIES, endpoint_id, limit, at, after_id)
    return [msgspec.convert(dict(r), DeliveryView, strict=False) for r in rows]


class Retried(enum.Enum):
    SENT = "sent"  # it is due now
    NOT_FOUND = "not_found"  # no such delivery of an enabled endpoint of the account
    IN_FLIGHT = "in_flight"  # an attempt is under way; its outcome comes first
    CAPPED = "capped"  # it was sent again by hand as often as it may be


_RETRY = """
WITH target AS (
    SELECT d.id, d.manual_retries, d.claimed_until > clock_timestamp() AS in_flight
    FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
    WHERE d.id = $3 AND d.endpoint_id = $2 AND e.account_id = $1 AND e.deleted_at IS NULL AND e.disabled_at IS NULL
    FOR UPDATE OF d
),
sent AS (
    UPDATE webhook_deliveries d SET status = 'pending', next_attempt_at = clock_timestamp(),
        manual_retries = d.manual_retries + 1, updated_at = clock_timestamp()
    FROM target WHERE d.id = target.id AND target.manual_retries < $4 AND target.in_flight IS NOT TRUE
    RETURNING d.id
)
SELECT target.manual_retries, target.in_flight, EXISTS (SELECT 1 FROM sent) AS sent FROM target
"""


async def retry_delivery(pool: asyncpg.Pool, account_id: str, endpoint_id: str, delivery_id: str,
                         *, cap: int) -> Retried:
    """Send a delivery again now, whatever became of it, while its endpoint is enabled, at most `cap` times
    by hand. Past its schedule, it gets this one attempt."""
    row = await pool.fetchrow(_RETRY, account_id, endpoint_id, delivery_id, cap)
    if row is None:
        return Retried.NOT_FOUND
    if row["sent"]:
        return Retried.SENT
    return Retried.IN_FLIGHT if row["in_flight"] else Retried.CAPPED
