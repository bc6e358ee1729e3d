"""Database faults: a session of ours that holds the provider lock and goes quiet is ended by the server's own
timeouts, and the jobs waiting behind the lock go on without failing; a service whose long-lived task dies
says so on /readyz and exits to be restarted."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.stack import running_stack, stack_settings
from vidjobs.common import db
from vidjobs.common.errors import ConfigError
from vidjobs.common.runtime import FAIL_GRACE_S, open_runtime

HOLD_S = 45.0  # longer than the jobs below are given to finish


async def test_a_quiet_session_holding_the_provider_lock_is_ended_by_the_server(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, db_lock_timeout_s=1.0,
                              db_idle_in_transaction_timeout_s=4.0, max_deliveries=3)
    # A session as every service opens them (same pool settings), frozen inside a transaction that holds
    # the lock every submission takes: a worker stopped by a debugger, a lost network, a stuck thread.
    pool = await db.create_pool(database_url, max_size=1, timeouts=db.Timeouts.of(settings))
    try:
        async with running_stack(settings) as stack:
            async with pool.acquire() as conn:
                tx = conn.transaction()
                await tx.start()
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('vidjobs.provider'), hashtext('fake'))")
                jobs = [await stack.create_job(params={"render_s": 0.1}) for _ in range(4)]
                done = await asyncio.gather(*(stack.wait_terminal(j["id"], within=HOLD_S - 15) for j in jobs))
                # The server ended the frozen session long ago.
                with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
                    await conn.execute("SELECT 1")
    finally:
        await pool.close()

    assert [j["status"] for j in done] == ["completed"] * 4


async def test_a_dead_long_lived_task_fails_readiness_then_the_service(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, metrics_port=0)
    async with open_runtime("test", settings) as rt:

        async def sweep() -> None:
            await asyncio.sleep(0.1)
            raise ConfigError("this sweep cannot go on")

        rt.watch(sweep(), "doomed-sweep")
        await asyncio.sleep(0.3)
        reason = await rt.readiness()
        stopped_at_once = rt.stop.is_set()
        await asyncio.wait_for(rt.stop.wait(), FAIL_GRACE_S + 2)

    assert reason is not None and "doomed-sweep died" in reason
    assert not stopped_at_once  # readiness says why before the process goes


async def test_the_relay_outlives_jetstream_errors(tmp_path, database_url, nats_url):
    """The work stream disappears under the relay (JetStream answers 'no stream'), then comes back: the
    relay keeps trying, and the events staged meanwhile are published."""
    from vidjobs.common import bus, events, outbox

    settings = stack_settings(tmp_path, database_url, nats_url)
    async with open_runtime("test", settings) as rt:
        await rt.js.delete_stream(bus.WORK_STREAM)
        async with rt.tx() as conn:
            await outbox.add(conn, [events.JobQueued(job_id="job_while_gone")])
        await asyncio.sleep(2)
        relay_alive = rt.failure is None and not rt.stop.is_set()
        await bus.ensure_streams(rt.js)
        for _ in range(100):
            if await rt.pool.fetchval("SELECT count(*) FROM outbox") == 0:
                break
            await asyncio.sleep(0.1)
        info = await rt.js.stream_info(bus.WORK_STREAM)

    assert relay_alive
    assert info.state.messages == 1
