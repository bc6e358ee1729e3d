"""Purging the accounts a platform deleted (`DELETE /v1/platform/accounts/{id}`): once a closed account has
no live job and no render being copied, its stored objects are removed, then its rows, in one transaction
through `purge_closed_account` (migration 0028), which runs as the schema's owner and deletes only the rows
of an account that is closed. A purge that stops half way is done again at the next look: objects first,
then rows, as `vidjobs accounts delete --purge` does.

The platform's audit trail keeps its lines about the account (who deleted it, and when): they hold its id,
nothing of its user.
"""

from __future__ import annotations

import asyncio
import logging
from graphlib import TopologicalSorter

import asyncpg

from vidjobs.common import faults
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import SQL_TERMINAL
from vidjobs.common.waits import set_within
from vidjobs.gateway.platform_accounts import PlatformAccounts
from vidjobs.storage.base import Storage, account_prefix

log = logging.getLogger("vidjobs.gateway.purges")

EVERY_S = 10.0
KEPT = frozenset({"platform_audit"})  # the platform's own record of what it did

# Tables of this schema with an account_id or job_id column, and the foreign keys between tables, from the
# catalog (which every role may read, unlike information_schema, which shows a role only its own columns).
_TABLES = """
SELECT DISTINCT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0
  AND NOT a.attisdropped AND a.attname IN ('account_id', 'job_id')
"""
_REFERENCES = """
SELECT child.relname AS child, parent.relname AS parent FROM pg_constraint f
JOIN pg_class child ON child.oid = f.conrelid JOIN pg_class parent ON parent.oid = f.confrelid
WHERE f.contype = 'f' AND f.connamespace = current_schema()::regnamespace
"""


async def purge_order(conn: asyncpg.Connection | asyncpg.Pool, kept: frozenset[str] = KEPT) -> list[str]:
    """Every table holding rows of an account or of its jobs (but `kept`), each after every table that
    references it."""
    tables = ({r["relname"] for r in await conn.fetch(_TABLES)} | {"jobs", "accounts"}) - kept
    graph: dict[str, set[str]] = {table: set() for table in tables}
    for ref in await conn.fetch(_REFERENCES):
        if ref["child"] in tables and ref["parent"] in tables and ref["child"] != ref["parent"]:
            graph[ref["parent"]].add(ref["child"])
    return list(TopologicalSorter(graph).static_order())


class Purges:
    def __init__(self, rt: Runtime, storage: Storage, accounts: PlatformAccounts):
        self._rt = rt
        self._storage = storage
        self._accounts = accounts
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Look now: an account was just closed (its jobs may all have ended already)."""
        self._wake.set()

    async def run(self) -> None:
        """Sweep every EVERY_S, and at once when poked, until the runtime stops; a failed pass is logged and
        the next one tries again."""
        while not self._rt.stop.is_set():
            self._wake.clear()
            try:
                await self.sweep()
            except Exception as exc:
                if faults.is_infrastructure(exc):
                    log.warning("account purge could not run; trying again next pass", extra={"error": repr(exc)})
                else:
                    log.exception("account purge failed; trying again next pass")
            await set_within(self._wake, EVERY_S)

    async def sweep(self) -> int:
        """Purge every closed account that is ready; returns how many were purged."""
        purged = 0
        for row in await self._rt.pool.fetch(
                "SELECT id FROM accounts WHERE closed_at IS NOT NULL ORDER BY closed_at LIMIT 20"):
            if await self.purge(row["id"]):
                purged += 1
        return purged

    async def purge(self, account_id: str) -> bool:
        # A create already past its credential check when the account closed may have made a job since.
        await self._accounts.cancel_jobs(account_id, waiting_only=False, reason="account deleted by its platform")
        if await self._busy(account_id):
            return False
        objects = await self._storage.delete_prefix(account_prefix(account_id))
        try:
            rows = await self._rt.pool.fetchval("SELECT purge_closed_account($1, $2)", account_id,
                                                await purge_order(self._rt.pool))
        except asyncpg.ObjectInUseError:
            return False  # a job or a copy appeared between the look and the purge: the next sweep
        log.info("account purged", extra={"account_id": account_id, "objects": objects, "rows": rows})
        return rows is not None

    async def _busy(self, account_id: str) -> bool:
        # Renders still being copied are purge_closed_account's to see (it refuses, and the next sweep tries).
        return bool(await self._rt.pool.fetchval(
            f"SELECT EXISTS (SELECT 1 FROM jobs WHERE account_id = $1 AND deleted_at IS NULL "
            f"AND status NOT IN {SQL_TERMINAL})", account_id))
