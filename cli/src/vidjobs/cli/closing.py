"""Closing an account (`vidjobs accounts delete`), and purging it for a data-deletion request.

Closing revokes every API key of the account, so nothing new starts, and cancels its live jobs through the
cancel path an owner's cancel takes (the transition function settles their credit; their providers are
asked to stop). Purging then removes everything the account left: its objects first, under the account's
key prefix, then all of its rows in one transaction, the account's own last. A purge that stops half way
has removed objects and no rows, or everything: run again, it finishes.

The rows are found by the schema, not by a list kept here: every table with an `account_id` column, every
table with a `job_id` column (rows about the account's jobs), deleted children before parents. A table
added later is purged without a change here. Left alone: the outbox (ids only, gone once published; a
provider stop request for a just-canceled job must still go out), the provider callback inbox (raw
callbacks keyed by the provider's ids, removed by its own retention), and a platform's audit trail (its
record of what it did about the account, which holds only the account's id).
"""

from __future__ import annotations

import asyncio
import time
from graphlib import TopologicalSorter

import asyncpg
import msgspec

from vidjobs.common import cancels
from vidjobs.common.states import SQL_TERMINAL
from vidjobs.gateway.purges import KEPT
from vidjobs.storage.base import Storage, account_prefix

SETTLE_POLL_S = 0.5
_LIVE_JOBS = f"SELECT id FROM jobs WHERE account_id = $1 AND status NOT IN {SQL_TERMINAL} AND deleted_at IS NULL"
# A media process still copying one of the account's renders may store objects after they were removed.
_COPYING = ("SELECT count(*) FROM media_copies c JOIN jobs j ON j.id = c.job_id "
            "WHERE j.account_id = $1 AND c.expires_at > clock_timestamp()")


class Closed(msgspec.Struct, kw_only=True):
    account_id: str
    keys_revoked: int
    jobs_canceled: list[str]


class Purged(msgspec.Struct, kw_only=True):
    account_id: str
    objects: int  # objects removed from storage
    rows: dict[str, int]  # rows removed, by table


class StillBusy(Exception):
    """The account still has live jobs or renders being copied; nothing was purged."""


async def close(conn: asyncpg.Connection, account_id: str) -> Closed:
    """Revoke the account's keys, then cancel its live jobs (each in its own transaction, so one that moved on
    meanwhile is simply left as it ended)."""
    revoked = await conn.fetch(
        "UPDATE api_keys SET revoked_at = now() WHERE account_id = $1 AND revoked_at IS NULL RETURNING id", account_id)
    canceled = await cancel_live(conn, account_id)
    return Closed(account_id=account_id, keys_revoked=len(revoked), jobs_canceled=canceled)


async def cancel_live(conn: asyncpg.Connection, account_id: str) -> list[str]:
    canceled = []
    for row in await conn.fetch(_LIVE_JOBS + " ORDER BY created_at", account_id):
        if await cancels.cancel(conn, row["id"], reason="account closed by an operator") is not None:
            canceled.append(row["id"])
    return canceled


async def busy(conn: asyncpg.Connection, account_id: str) -> str | None:
    """What keeps the account from being purged now, in words; None when nothing does."""
    live = len(await conn.fetch(_LIVE_JOBS, account_id))
    copying = await conn.fetchval(_COPYING, account_id)
    if not (live or copying):
        return None
    return f"{live} live job(s) and {copying} render(s) being copied into storage"


async def settle(conn: asyncpg.Connection, account_id: str, wait_s: float) -> None:
    """Wait up to `wait_s` for the account to have no live jobs and no copy in progress, canceling any live job
    that appears meanwhile (a create that was already past its key check). Raises StillBusy."""
    deadline = time.monotonic() + wait_s
    while (reason := await busy(conn, account_id)) is not None:
        if time.monotonic() >= deadline:
            raise StillBusy(reason)
        await cancel_live(conn, account_id)
        await asyncio.sleep(SETTLE_POLL_S)


async def purge(conn: asyncpg.Connection, storage: Storage, account_id: str) -> Purged:
    """Remove the account's objects, then its rows in one transaction (refused, with nothing removed, if a live
    job appeared meanwhile). Raises StillBusy."""
    objects = await storage.delete_prefix(account_prefix(account_id))
    async with conn.transaction():
        # Locked as the credit functions lock it: no credit moves on the account while its rows go.
        await conn.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
        # The ledger is append-only but for the entries of the account a purge names (migration 0025).
        await conn.execute("SELECT set_config('vidjobs.purging_account', $1, true)", account_id)
        if (reason := await busy(conn, account_id)) is not None:
            raise StillBusy(reason)
        rows = {}
        for table in await purge_order(conn):
            removed = await _delete_rows(conn, table, account_id)
            if removed:
                rows[table] = removed
    return Purged(account_id=account_id, objects=objects, rows=rows)


async def _delete_rows(conn: asyncpg.Connection, table: str, account_id: str) -> int:
    columns = await _columns(conn, table)
    about = []
    if table == "accounts":
        about.append("id = $1")
    if "account_id" in columns:
        about.append("account_id = $1")
    if "job_id" in columns and table != "jobs":
        about.append("job_id IN (SELECT id FROM jobs WHERE account_id = $1)")
    status: str = await conn.execute(f'DELETE FROM "{table}" WHERE {" OR ".join(about)}', account_id)
    return int(status.rsplit(" ", 1)[1])


async def _columns(conn: asyncpg.Connection, table: str) -> set[str]:
    rows = await conn.fetch("SELECT column_name FROM information_schema.columns "
                            "WHERE table_schema = current_schema() AND table_name = $1", table)
    return {r["column_name"] for r in rows}


async def purge_order(conn: asyncpg.Connection) -> list[str]:
    """Every table holding rows of an account or of its jobs, each after every table that references it."""
    tables = {r["table_name"] for r in await conn.fetch(
        """
        SELECT c.table_name FROM information_schema.columns c
        JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
        WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
          AND c.column_name IN ('account_id', 'job_id')
        """)} | {"jobs", "accounts"}
    tables -= KEPT  # a platform's own record of what it did about the account
    references = await conn.fetch(
        """
        SELECT child.relname AS child, parent.relname AS parent FROM pg_constraint f
        JOIN pg_class child ON child.oid = f.conrelid JOIN pg_class parent ON parent.oid = f.confrelid
        WHERE f.contype = 'f' AND f.connamespace = current_schema()::regnamespace
        """)
    # A table comes after the tables that reference it: they are emptied of the account's rows first.
    graph: dict[str, set[str]] = {table: set() for table in tables}
    for ref in references:
        if ref["child"] in tables and ref["parent"] in tables and ref["child"] != ref["parent"]:
            graph[ref["parent"]].add(ref["child"])
    return list(TopologicalSorter(graph).static_order())
