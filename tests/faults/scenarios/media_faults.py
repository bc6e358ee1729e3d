"""A render whose decoding kills the media process every time, among healthy ones. It must be given up on after
a bounded number of deaths (its job failed with `internal`, its message dead-lettered), the healthy jobs must
complete, and the scratch space of the killed copies must be removed."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from pathlib import Path

import asyncpg

from tests.faults.harness import fault_run
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick
from tests.faults.workload import Workload, create_jobs
from tests.stack import Stack
from vidjobs.media import scratch
from vidjobs.media.worker import DECODER_CRASHES

POISON = (Plan(jobs=20, over_s=6, at_s=0, lasts_s=0, settle_s=90, render_s=0.3),
          Plan.long(jobs=150, over_s=60, at_s=0, lasts_s=0, settle_s=300, render_s=0.5))
# How fast a killed copy comes back: the ack wait, and how long its lease on the render outlives it.
TIMING = ({"ack_wait_s": 2, "media_copy_lease_s": 3}, {"ack_wait_s": 10, "media_copy_lease_s": 15})


async def kill_whenever_it_decodes(stack: Stack, job_id: str, kills: list[int], landed: list[int]) -> None:
    """Play the part of a render that crashes its decoder: each time a media process decodes it, that
    process dies (as a decoder abort or an out-of-memory kill would take it down). A kill that comes just
    after the decode ended is not the render's doing: only those that landed mid-decode are `landed`."""
    conn = await asyncpg.connect(stack.settings.database_url)
    query = "SELECT owner FROM media_copies WHERE job_id = $1 AND decoding"
    try:
        while True:
            owner = await conn.fetchval(query, job_id)
            pid = stack.supervisor.pid("media")
            if owner is not None and pid is not None and pid not in kills and f"-{pid}-" in owner:
                os.kill(pid, signal.SIGKILL)
                kills.append(pid)
                await asyncio.sleep(0.3)  # the process is gone: what its row says now is what it left
                if await conn.fetchval(query, job_id) == owner:
                    landed.append(pid)
            await asyncio.sleep(0.001)  # a decode takes a few milliseconds: look often enough to catch one
    finally:
        await conn.close()


def scratch_of(pids: list[int]) -> list[Path]:
    return [p for p in Path(tempfile.gettempdir()).glob(f"{scratch.PREFIX}*") if scratch._owner(p) in pids]


async def poison_download(long: bool = False) -> Row:
    plan = pick(*POISON, long)
    async with fault_run("poison_download", **TIMING[long]) as run:
        # Five seconds of clip: its decode (the preview's three seconds) lasts long enough to be caught.
        poison = await run.stack.create_job(prompt="a render that kills its decoder", duration_s=5,
                                            params={"render_s": 0.2})
        kills: list[int] = []
        landed: list[int] = []
        killer = asyncio.create_task(kill_whenever_it_decodes(run.stack, poison["id"], kills, landed))
        try:
            created = await create_jobs(run.stack, Workload(plan.jobs, plan.over_s, plan.render_s))
            created.ids.append(poison["id"])
            await run.settle(created, plan.settle_s, plan.stall_s)
        finally:
            killer.cancel()
        final = await run.stack.job(poison["id"])
        await asyncio.sleep(3)  # the media process now running removes what the killed ones left
        row = run.row
        row.notes.append(f"media processes killed: {len(kills)} ({len(landed)} mid-decode)")
        row.expect(final["status"] == "failed" and (final["error"] or {}).get("code") == "internal",
                   f"the poison job ended {final['status']}, not failed with internal")
        row.expect(len(landed) == DECODER_CRASHES, f"{len(landed)} deaths mid-decode, not {DECODER_CRASHES}")
        row.expect(row.failed == 1 and row.stuck == 0, f"{row.failed} failed, {row.stuck} stuck: healthy jobs hurt")
        row.expect(row.over_rendered == 0 and row.repeated_moves == 0, "a render or a move was repeated")
        row.expect(not scratch_of(kills), f"scratch space left by killed copies: {scratch_of(kills)}")
    return run.row
