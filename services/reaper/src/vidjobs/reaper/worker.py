"""The reaper: delayed recovery checks, stage deadlines, the end of retry backoffs, the sweep that
republishes checks whose messages were lost, and retention expiry."""

from __future__ import annotations

import asyncio
from functools import partial

from vidjobs.common import bus, events
from vidjobs.common.render_deadlines import RenderDeadlines
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime, consumer
from vidjobs.reaper import retention, sweep, system_gauges
from vidjobs.reaper.backlog import SubmitQueue
from vidjobs.reaper.recovery import Context, on_recovery_due


async def main(rt: Runtime) -> None:
    ctx = Context(rt=rt, policies=Policies(rt.settings), submit_queue=SubmitQueue(rt.js),
                  deadlines=RenderDeadlines(rt.settings))
    # Checks wait here until due (a delayed nak each, within bus.ACK_WINDOW).
    spec = consumer(rt, "reaper-recovery", events.RECOVERY, partial(on_recovery_due, ctx), concurrency=16)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(bus.consume(rt.js, spec, rt.stop), name="recovery-consumer")
        tg.create_task(sweep.run(rt), name="recovery-sweep")
        tg.create_task(retention.run(rt), name="retention-sweep")
        tg.create_task(system_gauges.run(rt), name="system-gauges")
