"""The operator's platform keys (`vidjobs platform-keys`): made, listed, rotated with an overlap and revoked, as
the schema's owner; no service may make one (vidjobs.common.grants). What a key may do is
vidjobs.gateway.platformkeys'."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import msgspec

from vidjobs.common import ids
from vidjobs.common.errors import StoreError
from vidjobs.gateway.platformkeys import LIVE, PlatformKeyInfo, hash_key, new_key


async def create(conn: asyncpg.Connection, platform: str, scopes: list[str], name: str = "",
                 expires_in: timedelta | None = None) -> tuple[str, str]:
    """A new key for `platform` (made on first use); returns (key_id, key)."""
    async with conn.transaction():
        platform_id = await conn.fetchval(
            "INSERT INTO platforms (id, name) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name "
            "RETURNING id", ids.new("plat"), platform)
        key_id, key = ids.new("pk"), new_key()
        await conn.execute(
            "INSERT INTO platform_keys (id, platform_id, key_hash, prefix, name, scopes, expires_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval)",
            key_id, platform_id, hash_key(key), key[:10], name, scopes, expires_in)
    return key_id, key


async def listed(conn: asyncpg.Connection, platform: str | None = None) -> list[PlatformKeyInfo]:
    rows = await conn.fetch(
        """
        SELECT k.id, p.name AS platform, k.name, k.prefix, k.scopes, k.created_at, k.last_used_at, k.expires_at,
               k.revoked_at
        FROM platform_keys k JOIN platforms p ON p.id = k.platform_id
        WHERE $1::text IS NULL OR p.name = $1 ORDER BY k.created_at, k.id
        """, platform)
    return [msgspec.convert(dict(r), PlatformKeyInfo) for r in rows]


async def known(conn: asyncpg.Connection, key_id: str) -> bool:
    """Whether there is such a key, live or not."""
    return bool(await conn.fetchval("SELECT true FROM platform_keys WHERE id = $1", key_id))


async def platform_id(conn: asyncpg.Connection, platform: str) -> str | None:
    """The id of the platform of this name, if a key was ever made for it."""
    found: str | None = await conn.fetchval("SELECT id FROM platforms WHERE name = $1", platform)
    return found


async def revoke(conn: asyncpg.Connection, key_id: str) -> bool | None:
    """Revoke at once: True if this call did, False if it was already, None if there is no such key."""
    if await conn.fetchval("UPDATE platform_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL "
                           "RETURNING id", key_id) is not None:
        return True
    return False if await known(conn, key_id) else None


async def rotate(conn: asyncpg.Connection, key_id: str, overlap: timedelta) -> tuple[str, str]:
    """A new key with the same platform, name and scopes; the old one works for `overlap` more. Returns
    (new key id, new key)."""
    async with conn.transaction():
        old = await conn.fetchrow(
            f"SELECT k.id, p.name AS platform, k.name, k.scopes FROM platform_keys k "
            f"JOIN platforms p ON p.id = k.platform_id WHERE k.id = $1 AND {LIVE} FOR UPDATE OF k", key_id)
        if old is None:
            raise StoreError(f"no live platform key {key_id!r}; `vidjobs platform-keys list` shows them")
        await conn.execute(
            "UPDATE platform_keys SET expires_at = LEAST(COALESCE(expires_at, 'infinity'), now() + $2::interval) "
            "WHERE id = $1", key_id, overlap)
        return await create(conn, old["platform"], list(old["scopes"]), old["name"])
