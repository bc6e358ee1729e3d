"""`Idempotency-Key` on job creation: the same key with the same body answers the same job; with another
body, 409. The key is stored in the transaction that creates the job, and the table's primary key decides
a race between two requests carrying the same key."""

from __future__ import annotations

import hashlib

import asyncpg
import msgspec
from aiohttp import web

from services.gateway.bodies import CreateJob
from services.gateway.errors import ApiError, GatewayCode, invalid

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


class LostRace(Exception):
    """Another request with the same key committed first; this one's work must be rolled back."""


def key_from(request: web.Request) -> str | None:
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY_CHARS or not key.isascii() or not key.isprintable():
        raise invalid(f"{HEADER}: must be 1 to {MAX_KEY_CHARS} printable ASCII characters", status=400)
    return key


def digest(body: CreateJob) -> bytes:
    """A hash of the body as decoded, with defaults filled in and keys sorted: the same request written in
    another key order, or with a default spelled out, is the same request."""
    return hashlib.sha256(msgspec.json.encode(body, order="sorted")).digest()


async def previous(conn: asyncpg.Connection, account_id: str, key: str, body_hash: bytes) -> str | None:
    """The job id made earlier with this key, or None if the key is new."""
    row = await conn.fetchrow(
        "SELECT request_hash, job_id FROM idempotency_keys WHERE account_id = $1 AND key = $2", account_id, key,
    )
    if row is None:
        return None
    if bytes(row["request_hash"]) != body_hash:
        raise ApiError(409, GatewayCode.CONFLICT, f"this {HEADER} was already used with a different request body")
    return row["job_id"]


async def remember(conn: asyncpg.Connection, account_id: str, key: str, body_hash: bytes, job_id: str) -> None:
    """Raises LostRace when a concurrent request committed the same key first (the insert waits for it)."""
    stored = await conn.fetchval(
        """
        INSERT INTO idempotency_keys (account_id, key, request_hash, job_id) VALUES ($1, $2, $3, $4)
        ON CONFLICT (account_id, key) DO NOTHING
        RETURNING 1
        """,
        account_id, key, body_hash, job_id,
    )
    if stored is None:
        raise LostRace(key)
