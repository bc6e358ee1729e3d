"""Platform keys (`vjp_…`): the credential a product's backend holds to manage the accounts of its users.

A platform is one product; its keys are made by the operator (`vidjobs platform-keys create`), shown once,
stored as their SHA-256, and each holds scopes: `accounts` (create, read, change, disable and delete the
platform's accounts, and their plans), `credits` (grant and take back credit, read ledgers), `keys` (API
keys of its accounts), `tokens` (browser tokens), `usage` (accounts' usage) and `act` (call an account's own
routes, naming it in `Vidjobs-Account`). A platform reaches only the accounts it made.

A key is rotated with an overlap: the new key works at once and the old one until its expiry. A revoked or
expired key is refused within `CACHE_S` on every gateway (the time a key stays in a gateway's memory).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import secrets
from collections.abc import Callable
from datetime import datetime

import asyncpg
import msgspec

PREFIX = "vjp_"
CACHE_S = 5.0


class Scope(enum.StrEnum):
    ACCOUNTS = "accounts"
    CREDITS = "credits"
    KEYS = "keys"
    TOKENS = "tokens"
    USAGE = "usage"
    ACT = "act"


class PlatformKey(msgspec.Struct, frozen=True, kw_only=True):
    """A live platform key as a request sees it."""

    id: str
    platform_id: str
    platform_name: str
    scopes: frozenset[Scope]


class PlatformKeyInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A platform key as the operator lists it: never the key, never its hash."""

    id: str
    platform: str
    name: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


def is_platform_key(token: str) -> bool:
    return token.startswith(PREFIX)


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def parse_scopes(text: str) -> list[str]:
    """`accounts,credits` as the operator writes it; ValueError naming what is not a scope."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(f"name at least one scope: {', '.join(Scope)}")
    if unknown := [n for n in names if n not in Scope.__members__.values()]:
        raise ValueError(f"not a scope: {', '.join(unknown)} (the scopes are {', '.join(Scope)})")
    return sorted(set(names))


LIVE = "k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())"

_LOAD = f"""
SELECT k.id, k.platform_id, p.name AS platform_name, k.scopes
FROM platform_keys k JOIN platforms p ON p.id = k.platform_id
WHERE k.key_hash = $1 AND {LIVE}
"""


class PlatformKeys:
    """The platform keys this gateway has seen recently, each reread after `CACHE_S`."""

    def __init__(self, pool: asyncpg.Pool, clock: Callable[[], float] | None = None):
        self._pool = pool
        self._clock = clock or asyncio.get_running_loop().time
        self._keys: dict[bytes, tuple[PlatformKey | None, float]] = {}

    async def find(self, key: str) -> PlatformKey | None:
        digest = hash_key(key)
        cached = self._keys.get(digest)
        if cached is not None and self._clock() - cached[1] < CACHE_S:
            return cached[0]
        row = await self._pool.fetchrow(_LOAD, digest)
        found = None if row is None else PlatformKey(
            id=row["id"], platform_id=row["platform_id"], platform_name=row["platform_name"],
            scopes=frozenset(Scope(s) for s in row["scopes"]))
        if len(self._keys) > 10_000:  # unknown keys are remembered too; a flood of them must not grow this
            self._keys.clear()
        self._keys[digest] = (found, self._clock())
        return found
