"""Dependencies that stop answering without dying (SIGSTOP, tests/faults/stall.py), each on a server of the
test's own: a database call under a bound ends in time with TimeoutError and its connection is abandoned, not
reused; readiness says the database is not answering; a NATS client notices a frozen server within seconds.
The whole stack under the same stalls is the fault suite's postgres_stall and jetstream_stall."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.faults.natsd import NatsNode
from tests.faults.postgres import LocalPostgres
from tests.faults.stall import Stall
from vidjobs.common import bus, db, dbcalls, faults
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings

BOUND_S = 1.0
MARGIN_S = 2.0  # a slow machine's scheduling, never a stall's length


@pytest.fixture
async def stalled_pool(own_postgres: LocalPostgres) -> AsyncIterator[tuple[LocalPostgres, object]]:
    pool = await db.create_pool(own_postgres.admin_url, max_size=2)
    try:
        yield own_postgres, pool
    finally:
        pool.terminate()


async def test_a_bounded_call_to_a_stopped_database_ends_in_time_and_its_connection_is_abandoned(stalled_pool):
    server, pool = stalled_pool
    pid_before = await pool.fetchval("SELECT pg_backend_pid()")
    with Stall(lambda: server.pid).guarded() as stall:
        stall.begin()
        started = time.monotonic()
        with dbcalls.bounded(BOUND_S), pytest.raises(TimeoutError) as raised:
            async with pool.acquire() as conn, conn.transaction():
                await conn.fetchval("SELECT 1")
        took = time.monotonic() - started
        assert faults.is_infrastructure(raised.value)
        stall.end()
    assert took < BOUND_S + MARGIN_S, f"the call took {took:.1f}s under a {BOUND_S}s bound"
    # The stuck connection was terminated, not handed back: the next call gets a fresh session, at once.
    started = time.monotonic()
    with dbcalls.bounded(5.0):
        pid_after = await pool.fetchval("SELECT pg_backend_pid()")
    assert pid_after != pid_before
    assert time.monotonic() - started < 5.0


async def test_a_call_waiting_for_a_connection_keeps_to_the_bound_too(stalled_pool):
    server, pool = stalled_pool
    with Stall(lambda: server.pid).guarded() as stall:
        stall.begin()
        # Both connections stuck in calls of their own, a third call waits for one of them: all end in time.
        started = time.monotonic()
        with dbcalls.bounded(BOUND_S):
            results = await asyncio.gather(*(pool.fetchval("SELECT 1") for _ in range(3)), return_exceptions=True)
        took = time.monotonic() - started
    assert all(isinstance(r, TimeoutError) for r in results), results
    assert took < BOUND_S + MARGIN_S


class _Relay:
    def idle_for(self) -> float:
        return 0.0


class _Connected:
    is_connected = True


async def test_readiness_says_the_database_is_not_answering_while_it_is_stopped(stalled_pool):
    server, pool = stalled_pool
    rt = Runtime(name="probe", settings=Settings(), pool=pool, nc=_Connected(), js=None,  # type: ignore[arg-type]
                 relay=_Relay())  # type: ignore[arg-type]
    assert await rt.readiness(pulls=False) is None
    with Stall(lambda: server.pid).guarded() as stall:
        stall.begin()
        started = time.monotonic()
        why = await rt.readiness(pulls=False)
        took = time.monotonic() - started
    assert why == "database not answering"
    assert took < 5.0
    assert await rt.readiness(pulls=False) is None


async def test_a_nats_client_notices_a_frozen_server_within_seconds(tmp_path):
    settings = Settings(nats_ping_interval_s=1.0, nats_max_outstanding_pings=2)
    node = NatsNode(tmp_path / "nats").start()
    nc, _ = await bus.connect(node.url, name="stall-test", ping_interval_s=settings.nats_ping_interval_s,
                              max_outstanding_pings=settings.nats_max_outstanding_pings)
    try:
        with Stall(lambda: node.pid).guarded() as stall:
            stall.begin()
            started = time.monotonic()
            for _ in range(300):  # 30 s at most; the client's state is polled, it has no event to wait on
                if not nc.is_connected:
                    break
                await asyncio.sleep(0.1)
            noticed = time.monotonic() - started
            stall.end()
        # Pings every second, two may go unanswered: the third interval finds the server gone.
        assert noticed < 3 * settings.nats_ping_interval_s + MARGIN_S, f"noticed after {noticed:.1f}s"
    finally:
        await nc.close()
        node.stop()
