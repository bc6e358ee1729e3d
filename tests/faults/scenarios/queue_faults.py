"""Jobs that wait: one account with a concurrency cap of 1 and many slow renders, so nearly every job waits
its turn for minutes, beside the run's backlog (tests/faults/backlog.py: jobs parked on another provider for the
whole run). Waiting is free (docs/ARCHITECTURE.md "Faults"): a waiting job is parked, holds no message or timer, so
the submitter's only deliveries are the wake-ups of slots being handed out, one per render that ends, and the
queue sweep is a timer of its own that delivers nothing. Deliveries follow the renders that end, not the jobs
that wait."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
from nats.js import JetStreamContext

from tests.faults.harness import FaultRun, fault_run
from tests.faults.jsapi import jetstream, submitter_consumer
from tests.faults.report import Row
from tests.faults.workload import Workload, create_jobs
from vidjobs.common.states import SQL_RENDERING

GROWTH_ALLOWED = 1.5  # the last sample's delivery rate may be at most this multiple of the first full one
GROWTH_WATCH_S = 120.0  # a watch this long also checks that the rate does not grow with the wait
# Deliveries per waiting job per minute. With one render ending every few seconds, the wake-ups come to a
# fraction of one per job a minute (a job whose message came back to look went to 3-6 before parking).
MAX_RATE = 1.0
# Messages the submitter may hold at a sample, whatever the number waiting: the message of a job being
# handed to its provider as the sample is taken, and a `SlotFreed` wake-up.
IN_FLIGHT_ALLOWED = 2
# Deliveries over the watch beyond the wake-ups counted in it: wake-ups sent just before it began and
# delivered in it (a render ends every few seconds, so at most one or two).
WAKEUPS_IN_FLIGHT = 2


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
    freed: int  # the jobs' renders ended so far: each freed a slot and sent the one wake-up that hands it on

    def per_job(self) -> float:
        return self.messages / max(self.waiting, 1)


async def waiting_and_freed(database_url: str, ids: list[str]) -> tuple[int, int]:
    """(jobs not yet submitted, renders ended so far: moves out of a rendering status)."""
    conn = await asyncpg.connect(database_url)
    try:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status IN ('pending', 'retrying')", ids)
        freed = await conn.fetchval(
            f"SELECT count(*) FROM job_transitions WHERE job_id = ANY($1) AND from_status IN {SQL_RENDERING} "
            f"AND to_status NOT IN {SQL_RENDERING}", ids)
        return waiting, freed
    finally:
        await conn.close()


async def take_sample(run: FaultRun, js: JetStreamContext, ids: list[str], t0: float) -> Sample:
    info = await submitter_consumer(js)
    waiting, freed = await waiting_and_freed(run.database_url, ids)
    at = asyncio.get_running_loop().time() - t0
    return Sample(at, waiting, info.num_ack_pending + info.num_pending, info.delivered.consumer_seq, freed)


def delivery_rates(samples: list[Sample]) -> list[float]:
    """Deliveries per waiting job per minute between consecutive samples."""
    return [(b.delivered - a.delivered) / max(b.waiting, 1) / ((b.at_s - a.at_s) / 60)
            for a, b in zip(samples, samples[1:], strict=False)]


def judge(row: Row, samples: list[Sample], watch_s: float) -> None:
    rates = delivery_rates(samples)
    for s, rate in zip(samples, [None, *rates], strict=True):
        shown = "-" if rate is None else f"{rate:.2f}"
        row.notes.append(f"t={s.at_s:5.1f}s waiting={s.waiting} messages={s.messages} "
                         f"per_waiting_job={s.per_job():.2f} delivered={s.delivered} freed={s.freed} "
                         f"deliveries/job/min={shown}")
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


def judge_wakeups(row: Row, samples: list[Sample], backlog: int, sweep_every_s: float) -> None:
    """Every delivery while jobs wait is the wake-up of a slot being handed out: the submitter is delivered no
    more messages than renders ended (plus the few wake-ups already on their way), however many wait."""
    if len(samples) < 3:
        row.expect(False, f"{len(samples)} samples: too few to compare deliveries with wake-ups")
        return
    # From the second sample, as for the messages held: the first may still see the creates' own passes.
    first, last = samples[1], samples[-1]
    delivered, freed = last.delivered - first.delivered, last.freed - first.freed
    minutes = (last.at_s - first.at_s) / 60
    waiting = _mean([s.waiting for s in samples[1:]])
    beside = f" and {backlog} parked beside them" if backlog else ""
    only_wakeups = delivered <= freed + WAKEUPS_IN_FLIGHT
    verdict = (". The only deliveries left are those wake-ups: nothing per waiting job (no message or recovery "
               f"check of its own), and the queue sweep, one look per provider every {sweep_every_s:g} s, is the "
               "submitter's own timer and delivers nothing") if only_wakeups else ""
    row.notes.append(
        f"over {last.at_s - first.at_s:.0f} s the submitter was delivered {delivered} messages for {freed} slots "
        f"freed (one wake-up each, handing the slot to the next job): {delivered - freed:+d} beyond the "
        f"wake-ups, {delivered / max(waiting + backlog, 1) / max(minutes, 1e-9):.2f} per waiting job a minute "
        f"({waiting:.0f} waiting{beside}){verdict}")
    row.expect(freed > 0, "no render ended during the watch: no wake-up to compare the deliveries with")
    row.expect(only_wakeups, f"{delivered} deliveries for {freed} slots freed: something besides the wake-ups "
                             "is delivered while jobs wait")


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
        judge_wakeups(run.row, samples, len(run.backlog.ids) if run.backlog else 0,
                      run.stack.settings.queue_sweep_interval_s)
        run.row.expect(run.row.over_rendered == 0, f"{run.row.over_rendered} jobs rendered more than once")
        run.row.notes.append(f"{run.row.stuck} jobs still waiting when the watch ended (expected: cap 1)")
    return run.row
