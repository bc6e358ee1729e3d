"""A session of ours holds the provider's advisory lock and goes quiet (a frozen worker, a lost network) for
minutes while jobs arrive. PostgreSQL's own timeouts must end it (idle_in_transaction_session_timeout), and
the submissions waiting behind it must defer (lock_timeout), not fail."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial

import asyncpg

from tests.faults.harness import fault_run, under_fault
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick
from vidjobs.common import db

LOCK = (Plan(jobs=30, over_s=10, at_s=2, lasts_s=25, settle_s=60, render_s=0.5),
        Plan.long(jobs=100, over_s=60, at_s=5, lasts_s=420, settle_s=240, render_s=1))
# Short: the server ends the quiet session after 5 s; long: after the default minute.
IDLE_S = (5.0, 60.0)


async def advisory_lock_held(long: bool = False) -> Row:
    plan = pick(*LOCK, long)
    async with fault_run("advisory_lock_held", db_lock_timeout_s=2.0,
                         db_idle_in_transaction_timeout_s=IDLE_S[long]) as run:
        settings = run.stack.settings
        pool = await db.create_pool(run.database_url, max_size=1, timeouts=db.Timeouts.of(settings))
        held = _Held()
        try:
            await under_fault(run, plan, begin=partial(held.take, pool), end=held.let_go)
        finally:
            await pool.close()
        run.expect_healthy_outcome()
        run.row.notes.append(f"the quiet session was ended by the server: {held.ended_by_server}")
        run.row.expect(held.ended_by_server, "the server's timeouts did not end the session holding the lock")
    return run.row


class _Held:
    """A transaction that takes the lock every submission takes, then does nothing."""

    def __init__(self) -> None:
        self.conn: asyncpg.Connection | None = None
        self.pool: asyncpg.Pool | None = None
        self.tx: asyncpg.transaction.Transaction | None = None
        self.ended_by_server = False

    async def take(self, pool: asyncpg.Pool) -> None:
        self.pool, self.conn = pool, await pool.acquire()
        self.tx = self.conn.transaction()
        await self.tx.start()
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('vidjobs.provider'), hashtext('fake'))")

    async def let_go(self) -> None:
        assert self.conn is not None and self.pool is not None and self.tx is not None
        try:
            await self.conn.execute("SELECT 1")
        except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError):
            self.ended_by_server = True
        with contextlib.suppress(Exception):
            await self.tx.rollback()
        await asyncio.shield(self.pool.release(self.conn))
