"""The asyncpg pool, and forward-only migrations applied under an advisory lock."""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

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


class Timeouts(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds the server enforces on every session of a pool, so a stuck statement, a lock held by a
    session that went quiet, or a transaction left open by a frozen client is ended by PostgreSQL itself
    rather than holding up every other service."""

    statement_s: float = 30.0
    lock_s: float = 10.0
    idle_in_transaction_s: float = 60.0

    @classmethod
    def of(cls, settings: Any) -> Timeouts:
        return cls(statement_s=settings.db_statement_timeout_s, lock_s=settings.db_lock_timeout_s,
                   idle_in_transaction_s=settings.db_idle_in_transaction_timeout_s)

    def server_settings(self) -> dict[str, str]:
        return {
            "statement_timeout": f"{int(self.statement_s * 1000)}",
            "lock_timeout": f"{int(self.lock_s * 1000)}",
            "idle_in_transaction_session_timeout": f"{int(self.idle_in_transaction_s * 1000)}",
        }


async def create_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, timeouts: Timeouts | None = None,
) -> asyncpg.Pool:
    timeouts = timeouts or Timeouts()
    return await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection,
        # The client waits a little longer than the server, so the server's own, clearer error wins.
        command_timeout=timeouts.statement_s + 5, server_settings=timeouts.server_settings(),
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
