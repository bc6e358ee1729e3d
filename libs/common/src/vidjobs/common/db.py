"""The asyncpg pool, and forward-only migrations applied under an advisory lock."""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any, cast

import asyncpg
import msgspec
from asyncpg.pool import PoolConnectionProxy

from vidjobs.common import grants
from vidjobs.common.dbcalls import BoundedPool
from vidjobs.common.errors import ConfigError

log = logging.getLogger("vidjobs.db")

# Any constant works; it only has to be the same for every process that migrates this database.
_MIGRATION_LOCK = 0x7669646A6F6273


async def init_connection(conn: asyncpg.Connection) -> None:
    # jsonb columns come back as plain Python values; msgspec decodes them into Structs at the edge.
    await conn.set_type_codec(
        "jsonb", encoder=lambda v: msgspec.json.encode(v).decode(), decoder=msgspec.json.decode,
        schema="pg_catalog",
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What a connection goes through on its way back to the pool, beyond the rollback of a transaction left
    open that asyncpg always does: nothing. The default would send `pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` on every release, a fifth of all statements the stack sends. No session keeps
    state across a release: advisory locks are taken per transaction (the orphan sweep's one session lock
    is released, or its connection closed, before it goes back), nothing LISTENs, settings are made at
    connect or with SET LOCAL, and cursors live inside transactions."""


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
    url: str, *, min_size: int = 1, max_size: int = 10, timeouts: Timeouts | None = None, name: str = "vidjobs",
) -> asyncpg.Pool:
    """`name` is the sessions' application_name: pg_stat_activity and the server's log say which service a
    session belongs to. The pool keeps to the caller's call bound (vidjobs.common.dbcalls) and abandons a
    connection stuck in a call."""
    timeouts = timeouts or Timeouts()
    # The client waits a little longer than the server, so the server's own, clearer error wins; past that
    # the server is not answering at all, and the client gives up on it.
    client_s = timeouts.statement_s + 5
    pool = BoundedPool(
        url, min_size=min_size, max_size=max_size, max_queries=50_000, max_inactive_connection_lifetime=300.0,
        init=init_connection, reset=_keep_session, loop=None, connection_class=asyncpg.Connection,
        record_class=asyncpg.Record, acquire_timeout_s=client_s, command_timeout=client_s,
        server_settings={**timeouts.server_settings(), "application_name": name},
    )
    return await pool


def lent(conn: PoolConnectionProxy) -> asyncpg.Connection:
    """A pool's connection as the Connection it stands for. The proxy forwards every Connection method to
    the connection it holds until it goes back to the pool; asyncpg's stubs declare the two as unrelated
    classes, so the one place that hands a pooled connection on as a Connection says so here."""
    return cast(asyncpg.Connection, conn)


def _migration_files() -> list[tuple[int, str, str]]:
    found = []
    for entry in resources.files("vidjobs.common.migrations").iterdir():
        if entry.name.endswith(".sql"):
            number = int(entry.name.split("_", 1)[0])
            found.append((number, entry.name, entry.read_text()))
    return sorted(found)


class Schema(msgspec.Struct, frozen=True):
    """Which migrations a database has against the ones this code knows."""

    applied: list[int]
    known: list[int]

    @property
    def missing(self) -> list[int]:
        """This code's migrations the database lacks: `vidjobs migrate` applies them."""
        return sorted(set(self.known) - set(self.applied))

    @property
    def unknown(self) -> list[int]:
        """Migrations a newer version applied that this code does not know: this checkout is older."""
        return sorted(set(self.applied) - set(self.known))

    @property
    def current(self) -> bool:
        return not self.missing and not self.unknown


async def schema(conn: asyncpg.Connection) -> Schema:
    """Read which migrations are applied, changing nothing (a database never migrated has none)."""
    present = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version") if present else []
    return Schema(applied=[r["version"] for r in rows], known=[n for n, _, _ in _migration_files()])


async def migrate(url: str) -> list[str]:
    """Apply every migration not yet applied, then give the service roles exactly their declared privileges
    (vidjobs.common.grants), unless newer code has migrated the schema; returns the names applied. Safe to run
    concurrently.

    A service that starts on its own role runs this too: with nothing pending it only reads, so a role that
    may not change the schema passes; with something pending it fails, naming the command to run."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        try:
            applied = await _apply_pending(conn, await _pending(conn))
            # A schema migrated by newer code (a rollout or a rollback in progress) holds grants this code's
            # declaration does not name: applying ours would take them back from the newer pods.
            if await grants.owns_schema(conn) and not await _newer_than_this_code(conn):
                await grants.apply(conn, strict=False)
            return applied
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    finally:
        await conn.close()


async def _pending(conn: asyncpg.Connection) -> list[tuple[int, str, str]]:
    # Read before creating anything: CREATE TABLE IF NOT EXISTS needs the right to create even when the
    # table is there, which a service's own role does not have.
    if await conn.fetchval("SELECT to_regclass('schema_migrations')") is None:
        return _migration_files()
    done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
    return [m for m in _migration_files() if m[0] not in done]


async def _newer_than_this_code(conn: asyncpg.Connection) -> bool:
    known = max(number for number, _, _ in _migration_files())
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version > $1)", known))


async def _apply_pending(conn: asyncpg.Connection, pending: list[tuple[int, str, str]]) -> list[str]:
    if not pending:
        return []
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
    except asyncpg.InsufficientPrivilegeError as exc:
        raise ConfigError(f"{len(pending)} migrations are pending and this database user may not apply them: "
                          "run `vidjobs migrate` as the schema's owner first") from exc
    applied = []
    for number, name, sql in pending:
        async with conn.transaction():
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", number, name)
        log.info("migration applied", extra={"migration": name})
        applied.append(name)
    return applied
