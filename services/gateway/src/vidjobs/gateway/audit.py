"""The audit trail of platform actions: every request a platform key makes that may change something (any
method but GET and HEAD), on a platform route or acting for an account, with how it was answered. Read
with `GET /v1/platform/audit` (the platform's own) or `vidjobs platform-keys audit` (the operator).

A line is written once the action has answered, before the answer leaves: a request whose line cannot be
written (the database stopped answering) is logged with its request id instead.
"""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import requestids
from vidjobs.gateway.platformkeys import PlatformKey

log = logging.getLogger("vidjobs.gateway.audit")

_RECORD = """
WITH used AS (UPDATE platform_keys SET last_used_at = now() WHERE id = $2
              AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute'))
INSERT INTO platform_audit (platform_id, platform_key_id, action, account_id, target, status, request_id)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""


class Line(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    at: datetime
    platform_key_id: str
    action: str
    account_id: str | None
    target: str
    status: int
    request_id: str


async def record(pool: asyncpg.Pool, caller: PlatformKey, *, action: str, account_id: str | None, target: str,
                 status: int) -> None:
    request_id = requestids.current() or ""
    try:
        await pool.execute(_RECORD, caller.platform_id, caller.id, action, account_id, target[:500], status,
                           request_id)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        log.error("platform action not written to the audit trail", extra={
            "platform_key_id": caller.id, "action": action, "status": status, "error": repr(exc)})


async def trail(pool: asyncpg.Pool | asyncpg.Connection, platform_id: str | None, *, account_id: str | None,
                before_id: int | None, limit: int) -> list[Line]:
    """Newest first, strictly before `before_id`; every platform's when `platform_id` is None (the operator)."""
    rows = await pool.fetch(
        """
        SELECT id, at, platform_key_id, action, account_id, target, status, request_id FROM platform_audit
        WHERE ($1::text IS NULL OR platform_id = $1) AND ($2::text IS NULL OR account_id = $2)
          AND ($3::bigint IS NULL OR id < $3)
        ORDER BY id DESC LIMIT $4
        """, platform_id, account_id, before_id, limit)
    return [msgspec.convert(dict(r), Line) for r in rows]
