"""The asyncpg pool, and forward-only migrations applied under an advisory lock."""

from __future__ import annotations

import logging
from importlib import resources

import asyncpg
import msgspec

log = logging.getLogger("vidjobs.db")

# Any constant works; it only has to be the same for every process that migrates this database.
_MIGRATION_LOCK = 0x7669646A6F6273


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb columns come back as plain Python values; msgspec decodes them into Structs at the edge.
    await conn.set_type_codec(
        "jsonb", encoder=lambda v: msgspec.json.encode(v).decode(), decoder=msgspec.json.decode,
        schema="pg_catalog",
    )


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection, command_timeout=30,
    )


def _migration_files() -> list[tuple[int, str, str]]:
    found = []
    for entry in resources.files("libs.common.migrations").iterdir():
        if entry.name.endswith(".sql"):
            number = int(entry.name.split("_", 1)[0])
            found.append((number, entry.name, entry.read_text()))
    return sorted(found)


async def migrate(url: str) -> list[str]:
    """Apply every migration not yet applied; returns the names applied. Safe to run concurrently."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            applied = []
            for number, name, sql in _migration_files():
                if number in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", number, name
                    )
                log.info("migration applied", extra={"migration": name})
                applied.append(name)
            return applied
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    finally:
        await conn.close()
