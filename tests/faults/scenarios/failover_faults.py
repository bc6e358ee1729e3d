"""PostgreSQL failing over as CloudNativePG fails it over: the primary's node dies under load (SIGKILL) and its
streaming standby is promoted (tests.faults.replica). The services are given both servers in one multi-host
URL (`target_session_attrs=read-write`) and reach whichever takes writes.

- `failover_sync`: synchronous replication. A commit the API acknowledged is on the standby, so every
  acknowledged job survives the failover and completes, and nothing is rendered twice.
- `failover_async`: asynchronous replication, the standby `lag_s` behind when the primary dies (its WAL sender
  stopped for that long, as over a stalled link). A measurement, not a promise: the row lists the jobs the API
  acknowledged that the new primary does not hold, and what became of their renders at the provider (ended,
  stopped, fetched by our media service, asked to stop). What it checks is what the product promises of them:
  none is charged, announced to an app, or left rendering, and every job that survived ends."""

from __future__ import annotations

from collections import Counter
from functools import partial

import aiohttp
import asyncpg

from tests.faults.harness import FaultRun, blocking, fault_run, under_fault
from tests.faults.replica import ReplicatedPostgres
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick
from tests.faults.workload import Created

SYNC = (Plan(jobs=40, over_s=16, at_s=8, lasts_s=0, settle_s=60, stall_s=30),
        Plan.long(jobs=240, over_s=60, at_s=30, lasts_s=0, settle_s=240))
# The fault lasts as long as the standby lags (its sender stopped), and ends with the failover. Renders take 3 s,
# so a render of a job the failover loses may still be going when its provider calls back about it.
ASYNC = (Plan(jobs=60, over_s=20, at_s=8, lasts_s=4, settle_s=90, stall_s=30, render_s=3.0),
         Plan.long(jobs=240, over_s=60, at_s=30, lasts_s=4, settle_s=240, render_s=3.0))


# A callback the provider gave up sending while no server took writes is found by the recovery check; in a short
# run that check must not wait the default two minutes after the render's last word.
QUIET_S = 10.0


async def _noop() -> None:
    return None


async def failover_sync(long: bool = False) -> Row:
    plan = pick(*SYNC, long)
    async with fault_run("failover_sync", postgres=partial(ReplicatedPostgres, synchronous=True),
                         recovery_quiet_s=QUIET_S) as run:
        pair = _pair(run)
        created = await under_fault(run, plan, begin=blocking(pair.fail_over), end=_noop)
        lost = await _lost(run, created)
        run.row.notes.append(f"acknowledged jobs the new primary does not hold: {len(lost)} of {len(created.ids)}")
        run.row.expect(not lost, f"{len(lost)} acknowledged jobs lost in a synchronous failover: {lost[:3]}")
        run.expect_healthy_outcome()
        run.expect_no_service_restarts()
    return run.row


async def failover_async(long: bool = False) -> Row:
    plan = pick(*ASYNC, long)
    async with fault_run("failover_async", postgres=partial(ReplicatedPostgres, synchronous=False),
                         recovery_quiet_s=QUIET_S) as run:
        pair = _pair(run)
        created = await under_fault(run, plan, begin=blocking(pair.lag_receiving), end=blocking(pair.fail_over))
        lost = await _lost(run, created)
        fates = await _fates(run, lost)
        run.row.notes.append(f"acknowledged jobs the new primary does not hold: {len(lost)} of {len(created.ids)}; "
                             f"their renders: {dict(fates)}")
        _expect_survivors_end(run.row, len(lost))
        run.row.expect(fates["still rendering"] == 0, f"{fates['still rendering']} renders of lost jobs still going")
        run.row.expect(fates["charged"] == 0 and fates["announced"] == 0,
                       f"lost jobs charged ({fates['charged']}) or announced to apps ({fates['announced']})")
    return run.row


def _pair(run: FaultRun) -> ReplicatedPostgres:
    assert isinstance(run.postgres, ReplicatedPostgres)
    return run.postgres


def _expect_survivors_end(row: Row, lost: int) -> None:
    """A lost job is counted as stuck by the collector (it has no row, so no end): only survivors count."""
    row.expect(row.created - lost > 0 and row.completed > 0, "no surviving job completed")
    row.expect(row.stuck - lost == 0, f"{row.stuck - lost} surviving jobs not terminal after the settle wait")
    row.expect(row.failed == 0, f"{row.failed} jobs failed (an infrastructure fault is not the job's)")
    row.expect(row.over_rendered == 0, f"{row.over_rendered} jobs rendered more than once per attempt")


async def _lost(run: FaultRun, created: Created) -> list[str]:
    """The acknowledged jobs (a 201 or 200 from the API) that no row holds now."""
    conn = await asyncpg.connect(run.database_url)
    try:
        held = {r["id"] for r in await conn.fetch("SELECT id FROM jobs WHERE id = ANY($1)", created.ids)}
    finally:
        await conn.close()
    return [job_id for job_id in created.ids if job_id not in held]


async def _fates(run: FaultRun, lost: list[str]) -> Counter:
    """What became of the lost jobs' renders: the provider's last word on each, whether media fetched its
    output (a copy into our bucket, removed later by the orphan sweep), whether the poller asked for it to
    stop, and whether any credit entry or app webhook names the job."""
    fates: Counter = Counter()
    base = run.stack.settings.fake_provider_url
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/v1/_counters") as resp:
            fetched = (await resp.json())["output_fetches"]
        renders = []
        for job_id in lost:
            async with session.get(f"{base}/v1/renders", params={"job_id": job_id}) as resp:
                renders.extend((await resp.json())["data"])
    conn = await asyncpg.connect(run.database_url)
    try:
        asked = set(await conn.fetchval("SELECT coalesce(array_agg(provider_job_id), '{}') FROM provider_answers "
                                        "WHERE stop_asked_at IS NOT NULL"))
        fates["charged"] = await conn.fetchval("SELECT count(*) FROM credit_ledger WHERE job_id = ANY($1)", lost)
        fates["announced"] = await conn.fetchval("SELECT count(*) FROM webhook_deliveries WHERE job_id = ANY($1)",
                                                 lost)
    finally:
        await conn.close()
    fates["rendered"] = len(renders)
    for render in renders:
        fates[{"succeeded": "succeeded", "canceled": "stopped", "failed": "failed"}.get(
            render["status"], "still rendering")] += 1
        fates["fetched by media"] += render["id"] in fetched
        fates["stop asked"] += render["id"] in asked
    return fates
