"""Each process's database pool holds at most `VIDJOBS_DB_POOL_SIZE` connections, so many replicas of a service
can share one PostgreSQL (deploy/CAPACITY.md): what they hold is counted by the server itself."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.stack import stack_settings
from vidjobs.common import settings as settings_mod
from vidjobs.common.errors import ConfigError
from vidjobs.common.runtime import open_runtime


async def test_a_process_holds_no_more_connections_than_its_pool_size(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url).with_(db_pool_size=3)
    async with open_runtime("pooltest", settings) as rt:
        held = asyncio.Event()
        waiting = 0

        async def busy() -> None:
            nonlocal waiting
            waiting += 1
            async with rt.pool.acquire() as conn:
                await conn.execute("SELECT 1")
                await held.wait()

        tasks = [asyncio.create_task(busy()) for _ in range(8)]
        await asyncio.sleep(1.0)  # eight callers want one; three get one and keep it
        admin = await asyncpg.connect(database_url)
        try:
            sessions = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'vidjobs-pooltest'")
        finally:
            await admin.close()
        held.set()
        await asyncio.gather(*tasks)
    assert waiting == 8
    assert sessions == 3


@pytest.mark.parametrize("value", ["1", "0", "-4", "5000", "ten"])
def test_a_pool_size_out_of_range_is_refused_naming_the_variable(value):
    with pytest.raises(ConfigError, match="VIDJOBS_DB_POOL_SIZE"):
        settings_mod.load({"VIDJOBS_DB_POOL_SIZE": value})
