"""Jobs that wait: one account with a concurrency cap of 1 and many slow renders, so nearly every job waits
its turn for minutes. Waiting is free (DESIGN.md "Faults"): a waiting job is parked and holds no message, so
the submitter holds only the wake-ups of slots being handed out, and its deliveries follow the renders that
end, not the jobs that wait."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
from nats.js import JetStreamContext

from tests.faults.harness import FaultRun, fault_run
from tests.faults.jsapi import jetstream, submitter_consumer
from tests.faults.report import Row
from tests.faults.workload import Workload, create_jobs

GROWTH_ALLOWED = 1.5  # the last sample's delivery rate may be at most this multiple of the first full one
GROWTH_WATCH_S = 120.0  # a watch this long also checks that the rate does not grow with the wait
# Deliveries per waiting job per minute. With one render ending every few seconds, the wake-ups come to a
# fraction of one per job a minute (a job whose message came back to look went to 3-6 before parking).
MAX_RATE = 1.0
# Messages the submitter may hold at a sample, whatever the number waiting: the message of a job being
# handed to its provider as the sample is taken, and a `SlotFreed` wake-up.
IN_FLIGHT_ALLOWED = 2


@dataclass(frozen=True)
class QueuePlan:
    jobs: int
    over_s: float
    watch_s: float  # how long the queue is watched
    render_s: float
    sample_every_s: float


# The short watch is 25 s sampled every 5 s (not 60 s every 10 s), so the default test run stays short.
PLANS = (QueuePlan(jobs=100, over_s=5, watch_s=25, render_s=3, sample_every_s=5),
         QueuePlan(jobs=1000, over_s=30, watch_s=600, render_s=3, sample_every_s=10))


@dataclass(frozen=True)
class Sample:
    at_s: float
    waiting: int  # jobs not yet submitted (pending or retrying)
    messages: int  # the submitter's num_ack_pending + num_pending
    delivered: int  # the submitter's delivered.consumer_seq

    def per_job(self) -> float:
        return self.messages / max(self.waiting, 1)


async def waiting_jobs(database_url: str, ids: list[str]) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status IN ('pending', 'retrying')", ids)
    finally:
        await conn.close()


async def take_sample(run: FaultRun, js: JetStreamContext, ids: list[str], t0: float) -> Sample:
    info = await submitter_consumer(js)
    waiting = await waiting_jobs(run.database_url, ids)
    at = asyncio.get_running_loop().time() - t0
    return Sample(at, waiting, info.num_ack_pending + info.num_pending, info.delivered.consumer_seq)


def delivery_rates(samples: list[Sample]) -> list[float]:
    """Deliveries per waiting job per minute between consecutive samples."""
    return [(b.delivered - a.delivered) / max(b.waiting, 1) / ((b.at_s - a.at_s) / 60)
            for a, b in zip(samples, samples[1:], strict=False)]


def judge(row: Row, samples: list[Sample], watch_s: float) -> None:
    rates = delivery_rates(samples)
    for s, rate in zip(samples, [None, *rates], strict=True):
        shown = "-" if rate is None else f"{rate:.2f}"
        row.notes.append(f"t={s.at_s:5.1f}s waiting={s.waiting} messages={s.messages} "
                         f"per_waiting_job={s.per_job():.2f} delivered={s.delivered} deliveries/job/min={shown}")
    # The first sample may still see the last creates' own messages on their one pass.
    held = max((s.messages for s in samples[1:]), default=0)
    row.expect(held <= IN_FLIGHT_ALLOWED,
               f"the submitter held {held} messages while jobs waited (at most {IN_FLIGHT_ALLOWED} in flight allowed)")
    if len(rates) >= 4 and watch_s >= GROWTH_WATCH_S:
        # Past the first minute (every job's first look), the later half against the earlier half.
        settled = [r for s, r in zip(samples[1:], rates, strict=True) if s.at_s > 60] or rates
        early, late = _mean(settled[: len(settled) // 2]), _mean(settled[len(settled) // 2:])
        row.expect(late <= GROWTH_ALLOWED * max(early, 0.1),
                   f"deliveries per waiting job grew with wait: {early:.2f} -> {late:.2f} per minute")
    row.expect(max(rates, default=0.0) <= MAX_RATE,
               f"deliveries per waiting job reached {max(rates, default=0.0):.2f} per minute")


def _mean(values: list[float]) -> float:
    return sum(values) / max(len(values), 1)


async def waiting_queue(long: bool = False) -> Row:
    plan = PLANS[long]
    async with fault_run("waiting_queue", limits={"concurrency": 1}) as run:
        created = await create_jobs(run.stack, Workload(plan.jobs, plan.over_s, render_s=plan.render_s))
        run.say(f"{len(created.ids)} jobs created; watching the queue for {plan.watch_s:.0f}s")
        samples = []
        async with jetstream([run.stack.settings.nats_url]) as (_, js):
            t0 = asyncio.get_running_loop().time()
            while asyncio.get_running_loop().time() - t0 <= plan.watch_s:
                samples.append(await take_sample(run, js, created.ids, t0))
                run.say(f"sample: {samples[-1]}")
                await asyncio.sleep(plan.sample_every_s)
        await run.settle(created, within_s=0, stall_s=0)  # the queue is not drained: still-waiting is expected
        judge(run.row, samples, plan.watch_s)
        run.row.expect(run.row.over_rendered == 0, f"{run.row.over_rendered} jobs rendered more than once")
        run.row.notes.append(f"{run.row.stuck} jobs still waiting when the watch ended (expected: cap 1)")
    return run.row
