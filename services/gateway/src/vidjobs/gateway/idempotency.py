"""`Idempotency-Key` on job creation: the same key with the same body answers the same job; with another
body, 409. The key is stored in the transaction that creates the job, and the table's primary key decides
a race between two requests carrying the same key.

A key is remembered for `VIDJOBS_IDEMPOTENCY_TTL_S` (24 hours) from the request that stored it. After that
it is forgotten, whether or not the sweep has deleted its row yet: it is never replayed, and a request that
reuses it makes a new job and takes the row over."""

from __future__ import annotations

import hashlib
import logging

import asyncpg
import msgspec
from aiohttp import web

from vidjobs.gateway.apierrors import ApiError, GatewayCode, invalid
from vidjobs.gateway.bodies import CreateJob

log = logging.getLogger("vidjobs.gateway")

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255
SWEEP_BATCH = 1000


class LostRace(Exception):
    """Another request with the same key committed first; this one's work must be rolled back."""


def key_from(request: web.Request) -> str | None:
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY_CHARS or not key.isascii() or not key.isprintable():
        raise invalid(f"{HEADER}: must be 1 to {MAX_KEY_CHARS} printable ASCII characters", status=400)
    return key


# Fields CreateJob gained after keys were first stored, with their defaults. At its default such a field is
# left out of the hash, so a key stored before the field existed replays the same request after an upgrade
# rather than answering 409; any other value is part of the request like every field.
_ADDED_LATER: dict[str, object] = {"priority": "interactive", "fallback_models": None, "max_wait_s": None}


def digest(body: CreateJob) -> bytes:
    """A hash of the body as decoded, with defaults filled in and keys sorted: the same request written in
    another key order, or with a default spelled out, is the same request."""
    fields = msgspec.to_builtins(body)
    for name, default in _ADDED_LATER.items():
        if fields.get(name) == default:
            del fields[name]
    return hashlib.sha256(msgspec.json.encode(fields, order="sorted")).digest()


async def previous(
    conn: asyncpg.Connection, account_id: str, key: str, body_hash: bytes, ttl_s: float,
) -> str | None:
    """The job id made earlier with this key, or None if the key is new or older than `ttl_s`."""
    row = await conn.fetchrow(
        """
        SELECT request_hash, job_id FROM idempotency_keys
        WHERE account_id = $1 AND key = $2 AND created_at > now() - make_interval(secs => $3)
        """,
        account_id, key, ttl_s,
    )
    if row is None:
        return None
    if bytes(row["request_hash"]) != body_hash:
        raise ApiError(409, GatewayCode.CONFLICT, f"this {HEADER} was already used with a different request body")
    return str(row["job_id"])


async def remember(
    conn: asyncpg.Connection, account_id: str, key: str, body_hash: bytes, job_id: str, ttl_s: float,
) -> None:
    """Store the key, taking over a row older than `ttl_s`. Raises LostRace when a concurrent request
    committed the same key first (the insert waits for it)."""
    stored = await conn.fetchval(
        """
        INSERT INTO idempotency_keys AS i (account_id, key, request_hash, job_id, created_at)
        VALUES ($1, $2, $3, $4, now())
        ON CONFLICT (account_id, key) DO UPDATE
            SET request_hash = excluded.request_hash, job_id = excluded.job_id, created_at = excluded.created_at
            WHERE i.created_at <= now() - make_interval(secs => $5)
        RETURNING 1
        """,
        account_id, key, body_hash, job_id, ttl_s,
    )
    if stored is None:
        raise LostRace(key)


async def sweep(pool: asyncpg.Pool, ttl_s: float, *, batch: int = SWEEP_BATCH) -> int:
    """Delete keys older than `ttl_s`, a batch at a time (several gateways may sweep at once); returns how
    many went."""
    deleted = 0
    while True:
        status = await pool.execute(
            """
            DELETE FROM idempotency_keys WHERE (account_id, key) IN (
                SELECT account_id, key FROM idempotency_keys
                WHERE created_at <= now() - make_interval(secs => $1)
                ORDER BY created_at LIMIT $2
                FOR UPDATE SKIP LOCKED)
            """,
            ttl_s, batch,
        )
        count = int(status.split()[-1])
        deleted += count
        if count < batch:
            break
    if deleted:
        log.info("expired idempotency keys deleted", extra={"count": deleted, "ttl_s": ttl_s})
    return deleted
