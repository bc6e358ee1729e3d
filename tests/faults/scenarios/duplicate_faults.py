"""Every work message delivered several times: a tap on the work subjects republishes each message the
services publish, twice more, under ids of its own (so JetStream's duplicate window does not drop them),
some at once and some a little later. Consumers must reread the row and do nothing twice."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from tests.faults.harness import fault_run, under_fault
from tests.faults.jsapi import jetstream
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick

COPIES = 2  # extra deliveries of every message
LATEST_COPY_S = 3.0  # a copy goes out up to this long after the original
COPY_HEADER = "Vidjobs-Faults-Copy"  # marks our own copies, which the tap must not copy again

STORM = (Plan(jobs=30, over_s=10, at_s=0, lasts_s=12, settle_s=45),
         Plan.long(jobs=300, over_s=60, at_s=0, lasts_s=70, settle_s=240))


class Tap:
    """Copies every message published to vidjobs.work.> back into the work stream."""

    def __init__(self, js: JetStreamContext):
        self.js = js
        self.ids = itertools.count()
        self.copied = 0
        self.failed = 0
        self.pending: set[asyncio.Task] = set()

    async def on_message(self, msg: Msg) -> None:
        if msg.headers and COPY_HEADER in msg.headers:
            return
        for _ in range(COPIES):
            task = asyncio.create_task(self.copy(msg.subject, msg.data, random.uniform(0, LATEST_COPY_S)))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def copy(self, subject: str, data: bytes, after_s: float) -> None:
        await asyncio.sleep(after_s)
        headers = {COPY_HEADER: "1", "Nats-Msg-Id": f"faults-copy-{next(self.ids)}"}
        try:
            await self.js.publish(subject, data, headers=headers, timeout=5)
            self.copied += 1
        except Exception:  # a lost copy only makes the storm milder; counted and shown
            self.failed += 1


async def duplicate_storm(long: bool = False) -> Row:
    plan = pick(*STORM, long)
    async with fault_run("duplicate_storm") as run, jetstream([run.stack.settings.nats_url]) as (nc, js):
        tap = Tap(js)
        subscription = None

        async def tap_on() -> None:
            nonlocal subscription
            subscription = await nc.subscribe("vidjobs.work.>", cb=tap.on_message)

        async def tap_off() -> None:
            if subscription is not None:
                await subscription.unsubscribe()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tap.pending)

        await under_fault(run, plan, begin=tap_on, end=tap_off)
        run.row.notes.append(f"copies published: {tap.copied} (failed {tap.failed})")
        run.row.expect(tap.copied > 0, "the tap copied nothing: the storm did not happen")
        run.expect_healthy_outcome()
    return run.row
