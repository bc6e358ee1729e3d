"""The stream feeds' estimate refresh shares the gateway's event loop fairly: remaking thousands of followed jobs'
estimates (each from the process's shared reads, so with nothing to wait for) gives the loop back every few
dozen jobs, rather than holding every request and every stream behind one pass. Through an in-process gateway
on the tests' PostgreSQL and NATS, with real streams open on waiting jobs."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.gateway_harness import auth, gateway_settings, read_event, running_gateway
from tests.support import wait_until
from vidjobs.gateway import feeds as feeds_module

FOLLOWED = 90  # within the test client's 100 connections


class Counting:
    """A tenant as the feeds use it, counting the estimates remade through it."""

    def __init__(self, tenant: Any, counter: list[int]) -> None:
        self._tenant, self._counter = tenant, counter

    async def estimated(self, owned: Any, **kwargs: Any) -> Any:
        self._counter[0] += 1
        return await self._tenant.estimated(owned, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tenant, name)


async def test_a_refresh_of_many_followed_jobs_gives_the_loop_back_every_slice(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, estimate_refresh_s=0.3,
                                max_streams_per_key=FOLLOWED, max_streams_per_account=FOLLOWED)
    async with running_gateway(settings) as h:
        key = await h.key(concurrency=1, requests_per_s=1000.0, request_burst=1000)
        ids = []
        for _ in range(FOLLOWED):
            status, job = await h.post_job(key)
            assert status == 201, job
            ids.append(job["id"])
        streams = [await h.client.get(f"/v1/jobs/{job_id}/stream", headers=auth(key)) for job_id in ids]
        try:
            for resp in streams:
                assert (await read_event(resp))[1]["status"] == "pending"
            feeds = h.gw.feeds
            assert len(feeds.followed()) == FOLLOWED

            remade = [0]
            real_tenant_of = feeds._tenant_of
            feeds._tenant_of = lambda account_id: Counting(real_tenant_of(account_id), remade)
            # How many estimates the refresh remade between two turns of another task: the longest stretch
            # it held the loop.
            longest = 0

            async def turns() -> None:
                nonlocal longest
                last = remade[0]
                while True:
                    await asyncio.sleep(0)
                    longest, last = max(longest, remade[0] - last), remade[0]

            ticker = asyncio.create_task(turns())
            try:
                async def two_passes() -> bool:
                    return remade[0] >= 2 * FOLLOWED

                await wait_until(two_passes, within=30, interval=0.05, what="two refreshes of every followed job")
            finally:
                ticker.cancel()
        finally:
            for resp in streams:
                resp.close()
    slice_ = feeds_module.REFRESH_SLICE
    assert longest <= slice_, f"the refresh remade {longest} estimates without giving the loop back (slice {slice_})"
