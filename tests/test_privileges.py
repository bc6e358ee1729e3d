"""What the service roles may not do, proven by PostgreSQL refusing it (libs/common/grants.py)."""

from __future__ import annotations

from vidjobs.common import grants
from vidjobs.common.grants import GRANTS


async def test_grants_put_back_a_column_privilege_changed_by_hand(pool):
    drift = (
        "GRANT SELECT (secret) ON webhook_endpoints TO vidjobs_media",
        "GRANT UPDATE (name) ON accounts TO vidjobs_poller",
        "GRANT CREATE ON SCHEMA public TO vidjobs_submitter",
        "GRANT CREATE ON SCHEMA public TO PUBLIC",
    )
    seen = {}
    async with pool.acquire() as admin:
        for statement in drift:
            await admin.execute(statement)
            seen[statement] = await grants.in_step(admin)
            assert await grants.apply(admin)
        held = await grants.held(admin)
        in_step = await grants.in_step(admin)

    assert seen == dict.fromkeys(drift, False)
    assert held == GRANTS and in_step
    async with pool.acquire() as admin:
        assert await grants.may_create(admin) == []  # no role adds objects to the schema
