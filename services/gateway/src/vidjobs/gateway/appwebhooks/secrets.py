"""The secrets that sign deliveries: one per endpoint, and one per account for the `webhook_url` a job names
for itself. Each is shown once, when it is made, and stored sealed (vidjobs.gateway.sealing) for its row
and column. Rotating one keeps the secret it replaces signing beside the new one until the overlap asked for
ends (Standard Webhooks carries several signatures in `webhook-signature`), so a receiver can switch to the
new secret without rejecting a delivery meanwhile."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg
import msgspec
from asyncpg.pool import PoolConnectionProxy

from vidjobs.common import signatures
from vidjobs.common.runtime import Runtime
from vidjobs.gateway import sealing
from vidjobs.gateway.sealing import Keyring


@dataclass(frozen=True)
class Kind:
    """Where one kind of secret lives: the places its values are sealed for (`<table>.<column>`, with the row's
    id appended) and its statements, each naming the row as $1."""

    current: str
    previous: str
    lock: str  # the current secret (sealed, plaintext), the row locked for a rotation
    store: str  # $2 the new secret sealed, $3 the previous one sealed (NULL: none), $4 seconds it keeps signing
    signing: str  # the current secret (sealed, plaintext) and the previous one while it still signs


ENDPOINT = Kind(
    current="webhook_endpoints.secret",
    previous="webhook_endpoints.previous_secret",
    lock="SELECT secret_sealed AS sealed, secret AS plain FROM webhook_endpoints "
         "WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL FOR UPDATE",
    store="""
        UPDATE webhook_endpoints SET secret_sealed = $2, secret = '', secret_created_at = clock_timestamp(),
            previous_secret_sealed = $3,
            previous_secret_expires_at = CASE WHEN $3::text IS NOT NULL
                                              THEN clock_timestamp() + make_interval(secs => $4) END
        WHERE id = $1
        RETURNING secret_created_at AS created_at, previous_secret_expires_at AS previous_expires_at
        """,
    signing="SELECT secret_sealed AS sealed, secret AS plain, CASE WHEN previous_secret_expires_at > "
            "clock_timestamp() THEN previous_secret_sealed END AS previous FROM webhook_endpoints WHERE id = $1",
)

ACCOUNT = Kind(
    current="accounts.webhook_secret",
    previous="accounts.webhook_previous_secret",
    lock="SELECT webhook_secret_sealed AS sealed, webhook_secret AS plain FROM accounts WHERE id = $1 FOR UPDATE",
    store="""
        UPDATE accounts SET webhook_secret_sealed = $2, webhook_secret = '',
            webhook_secret_created_at = clock_timestamp(), webhook_previous_secret_sealed = $3,
            webhook_previous_secret_expires_at = CASE WHEN $3::text IS NOT NULL
                                                      THEN clock_timestamp() + make_interval(secs => $4) END
        WHERE id = $1
        RETURNING webhook_secret_created_at AS created_at, webhook_previous_secret_expires_at AS previous_expires_at
        """,
    signing="SELECT webhook_secret_sealed AS sealed, webhook_secret AS plain, CASE WHEN "
            "webhook_previous_secret_expires_at > clock_timestamp() THEN webhook_previous_secret_sealed END "
            "AS previous FROM accounts WHERE id = $1",
)


def place(column: str, row_id: str) -> str:
    """What a value is sealed for: one column of one row."""
    return f"{column}:{row_id}"


class Issued(msgspec.Struct, frozen=True, kw_only=True):
    """A secret just made: the one time it is shown."""

    secret: str
    created_at: datetime
    previous_expires_at: datetime | None  # until then, the secret it replaced signs too


class Held(msgspec.Struct, frozen=True, kw_only=True):
    """What is known of the account's secret without showing it."""

    created_at: datetime | None  # None: the account has made none
    previous_expires_at: datetime | None


def new_secret() -> str:
    return signatures.new_secret()


def sealed_new(ring: Keyring, kind: Kind, row_id: str) -> tuple[str, str]:
    """A new secret for a row about to be written, and the same sealed for it."""
    secret = new_secret()
    return secret, ring.seal(secret, place(kind.current, row_id))


def opened(ring: Keyring, kind: Kind, row_id: str, sealed: str | None, plain: str | None) -> str | None:
    """The row's current secret, None if it has none. Plaintext is what the previous release wrote: read
    until appwebhooks/resealing.py seals it, so a row not yet swept still signs."""
    if sealed is not None:
        return ring.unseal(sealed, place(kind.current, row_id))
    return plain or None


async def _rotate(conn: PoolConnectionProxy[asyncpg.Record], ring: Keyring, kind: Kind, row_id: str,
                  lock_args: tuple[str, ...], overlap_s: int) -> Issued | None:
    row = await conn.fetchrow(kind.lock, *lock_args)
    if row is None:
        return None
    current = opened(ring, kind, row_id, row["sealed"], row["plain"])
    # The replaced secret keeps signing only for an overlap asked for.
    previous = ring.seal(current, place(kind.previous, row_id)) if current is not None and overlap_s > 0 else None
    secret, sealed = sealed_new(ring, kind, row_id)
    stored = await conn.fetchrow(kind.store, row_id, sealed, previous, float(overlap_s))
    assert stored is not None  # the row is locked since it was read
    return Issued(secret=secret, created_at=stored["created_at"], previous_expires_at=stored["previous_expires_at"])


async def rotate_endpoint_secret(pool: asyncpg.Pool, ring: Keyring, account_id: str, endpoint_id: str,
                                 overlap_s: int) -> Issued | None:
    """A new secret for the account's endpoint, the old one signing too for `overlap_s`; None if no such
    endpoint. The row is locked while it is read and written, so two rotations at once keep a chain."""
    async with pool.acquire() as conn, conn.transaction():
        return await _rotate(conn, ring, ENDPOINT, endpoint_id, (endpoint_id, account_id), overlap_s)


async def issue_account_secret(pool: asyncpg.Pool, ring: Keyring, account_id: str, overlap_s: int) -> Issued:
    """The account's first secret, or a new one in place of the current (which signs too for `overlap_s`)."""
    async with pool.acquire() as conn, conn.transaction():
        issued = await _rotate(conn, ring, ACCOUNT, account_id, (account_id,), overlap_s)
    if issued is None:
        raise LookupError(f"no account {account_id}")
    return issued


async def account_secret_held(pool: asyncpg.Pool, account_id: str) -> Held:
    row = await pool.fetchrow(
        "SELECT webhook_secret_created_at AS created_at, CASE WHEN webhook_previous_secret_expires_at > "
        "clock_timestamp() THEN webhook_previous_secret_expires_at END AS previous_expires_at "
        "FROM accounts WHERE id = $1", account_id)
    if row is None:
        raise LookupError(f"no account {account_id}")
    return Held(created_at=row["created_at"], previous_expires_at=row["previous_expires_at"])


async def has_account_secret(conn: asyncpg.Connection | asyncpg.Pool, account_id: str) -> bool:
    return bool(await conn.fetchval(
        "SELECT webhook_secret_sealed IS NOT NULL OR webhook_secret <> '' FROM accounts WHERE id = $1", account_id))


async def signing_secrets(rt: Runtime, account_id: str, endpoint_id: str | None) -> list[str]:
    """The secrets a delivery is signed with, the current one first, then the one a rotation replaced while
    its overlap lasts: its endpoint's, or the account's for a job's own webhook_url. Empty when there is
    none (the endpoint's row is gone, or the account never made its secret)."""
    kind, row_id = (ENDPOINT, endpoint_id) if endpoint_id is not None else (ACCOUNT, account_id)
    ring = sealing.keyring(rt.settings)
    row = await rt.pool.fetchrow(kind.signing, row_id)
    current = None if row is None else opened(ring, kind, row_id, row["sealed"], row["plain"])
    if row is None or current is None:
        return []
    previous = row["previous"]
    return [current] if previous is None else [current, ring.unseal(previous, place(kind.previous, row_id))]
