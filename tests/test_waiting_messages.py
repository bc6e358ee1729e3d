"""Waiting is free: a job waiting for a slot is parked, with no message going round, no recovery check coming
back and no lock taken for it, however long it waits. The event that frees a slot hands it out at once (a
render ending, at its own provider or, for a job its account's cap held back, at another), and one sweep per
provider catches a wake-up that was lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import asyncpg
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from tests.stack import demo_key, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import bus, creation, events, jobs, waiting
from vidjobs.common.bus import WORK_STREAM
from vidjobs.common.events import SlotFreed, WorkEvent
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import ProviderLimits
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import transition
from vidjobs.gateway.accounts import create_account

WAITING = 12
ONE_SLOT = {"fake": ProviderLimits(concurrency=1, rate_per_s=1000, burst=1000)}
CHECKS_WATCHED = 3  # recovery checks of the rendering job that come round while the waiting jobs are watched


class Heard(NamedTuple):
    subject: str
    event: WorkEvent
    deferred: bool  # a copy a deferral published again, not a new message


@dataclass
class Watch:
    """Every message stored on the work subjects, heard as it is published (a core subscription: JetStream's
    copies of deferred work are published too), and the consumers' counts, all over ONE connection: a count
    read after a message was stored is answered after that message reached `heard`."""

    nc: Client
    heard: list[Heard] = field(default_factory=list)

    async def on_message(self, msg: Msg) -> None:
        deferred = bus.NOT_BEFORE_HEADER in (msg.headers or {})
        self.heard.append(Heard(msg.subject, events.decode(msg.subject, msg.data), deferred))

    async def deliveries(self, consumer: str) -> tuple[int, int]:
        """(messages the consumer holds: pending + unacknowledged, deliveries so far)."""
        info = await self.nc.jetstream().consumer_info(WORK_STREAM, consumer)
        return info.num_pending + info.num_ack_pending, info.delivered.consumer_seq

    async def held(self, subject: str) -> list[WorkEvent]:
        """The messages the work stream still holds on `subject` (a work queue: those not yet acknowledged)."""
        jsm, found, seq = self.nc.jetstream(), [], 0
        while True:
            try:
                raw = await jsm.get_msg(WORK_STREAM, seq, subject=subject, next=True)
            except NotFoundError:
                return found
            found.append(events.decode(subject, raw.data or b""))
            seq = raw.seq + 1


@asynccontextmanager
async def watching(nats_url: str) -> AsyncIterator[Watch]:
    nc = await nats.connect(nats_url)
    watch = Watch(nc)
    try:
        await nc.subscribe("vidjobs.work.>", cb=watch.on_message)
        yield watch
    finally:
        await nc.close()


async def _fetch(database_url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def _parked_ids(database_url: str, ids: list[str]) -> set[str]:
    rows = await _fetch(database_url, "SELECT id FROM jobs WHERE id = ANY($1) AND status = 'pending' "
                                      "AND recover_at IS NULL", ids)
    return {r["id"] for r in rows}


async def _one_rendering_rest_parked(database_url: str, ids: list[str]) -> str | None:
    """The id of the one job rendering, once it is and every other job has been handled once and parked."""
    rendering = await _fetch(database_url, "SELECT id FROM jobs WHERE id = ANY($1) "
                                           "AND status IN ('submitted', 'processing')", ids)
    parked = await _parked_ids(database_url, ids)
    return rendering[0]["id"] if len(rendering) == 1 and len(parked) == WAITING else None


async def _first_checks_gone(watch: Watch, rendering: str) -> bool:
    """Every message of the parked jobs delivered and done with: the submitter holds none, and the only
    recovery checks the stream still holds are the rendering job's (the parked jobs' first ones, due 1 s after
    their create, came round and found them parked)."""
    held_checks = await watch.held(events.RECOVERY)
    return (await watch.deliveries("submitter"))[0] == 0 and {e.job_id for e in held_checks} <= {rendering}


async def _checks_came_round(heard: list[Heard], job_id: str) -> bool:
    """Whether CHECKS_WATCHED new recovery checks of `job_id` are among `heard` (each is scheduled as the one
    before it is handled, one interval later)."""
    new = [h for h in heard if h.subject == events.RECOVERY and h.event.job_id == job_id and not h.deferred]
    return len(new) >= CHECKS_WATCHED


async def test_waiting_jobs_hold_no_message_and_cost_no_deliveries(tmp_path, database_url, nats_url):
    # Recovery checks every 2 s: a waiting job whose checks went on would have one come round with each of the
    # rendering job's (whose "started" callback puts its next check no further than 2 s away either).
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=2,
                              recovery_quiet_s=2)
    key = await demo_key(database_url, concurrency=1)
    async with running_stack(settings, key=key) as stack, watching(nats_url) as watch:
        ids = [(await stack.create_job(params={"render_s": 60}))["id"] for _ in range(WAITING + 1)]
        rendering = await wait_until(lambda: _one_rendering_rest_parked(database_url, ids), within=60,
                                     what="one job rendering and every other one parked")
        await wait_until(lambda: _first_checks_gone(watch, rendering), within=60,
                         what="the parked jobs' messages to be delivered and gone")
        first, mark = await watch.deliveries("submitter"), len(watch.heard)
        # Watched over a span of the rendering job's own checks, not of seconds: however slow the machine, a
        # parked job with checks of its own would have had them come round in it too.
        await wait_until(lambda: _checks_came_round(watch.heard[mark:], rendering), within=120,
                         what=f"{CHECKS_WATCHED} recovery checks of the rendering job")
        then, held_checks = await watch.deliveries("submitter"), await watch.held(events.RECOVERY)
        parked = await _parked_ids(database_url, ids)
    during = watch.heard[mark:]

    assert parked == set(ids) - {rendering}
    assert then == (0, first[1]), (first, then)  # the submitter held none and was handed none
    assert [h for h in during if h.subject == events.SUBMIT] == []
    # Not one recovery check of a parked job was published, first or deferred, nor is one still held.
    assert {h.event.job_id for h in during if h.subject == events.RECOVERY} == {rendering}, during
    assert {e.job_id for e in held_checks} <= {rendering}, held_checks


async def test_a_job_behind_a_full_quota_starts_when_the_slot_frees(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=ONE_SLOT, queue_sweep_interval_s=3600)
    async with running_stack(settings) as stack, watching(nats_url) as watch:
        ahead = await stack.create_job(params={"render_s": 5})
        behind = await stack.create_job(params={"render_s": 0.1})
        await stack.wait_for_status(ahead["id"], "processing")
        # Parked, and its message acknowledged: waited for, as on a loaded machine either can take longer than
        # any fixed sleep.
        await wait_until(lambda: _parked(database_url, behind["id"]), within=10, what="the job behind to park")
        await wait_until(lambda: _holds_nothing(watch, "submitter"), within=10, what="its message acknowledged")
        before, mark = await watch.deliveries("submitter"), len(watch.heard)
        still_rendering = (await stack.job(ahead["id"]))["status"] == "processing"  # the slot not yet freed
        done = await stack.wait_terminal(behind["id"], within=60)
        await wait_until(lambda: _holds_nothing(watch, "submitter"), within=10, what="every wake-up handled")
        after = await watch.deliveries("submitter")
        moves = await _fetch(database_url, "SELECT job_id, to_status, at FROM job_transitions "
                                           "WHERE job_id = ANY($1) ORDER BY at", [ahead["id"], behind["id"]])
    published = [h.event for h in watch.heard[mark:] if h.subject == events.SUBMIT]

    assert done["status"] == "completed"
    assert still_rendering, "the job ahead had finished before the wait was watched: nothing to observe"
    freed = next(m["at"] for m in moves if m["job_id"] == ahead["id"] and m["to_status"] == "downloading")
    started = next(m["at"] for m in moves if m["job_id"] == behind["id"] and m["to_status"] == "submitted")
    assert freed <= started, (freed, started)
    # What started it: since it parked the submitter was handed the freed slot's wake-up and nothing else. No
    # message of the parked job's own was published, and none delivered (a redelivery would be a delivery more
    # than was published); with the sweep an hour away, no timer moved it.
    assert published and all(e == SlotFreed(provider="fake") for e in published), published
    assert after[1] - before[1] == len(published), (before, after, published)


async def test_a_lost_wake_up_is_caught_by_the_queue_sweep(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=ONE_SLOT, queue_sweep_interval_s=1)
    async with running_stack(settings) as stack:
        ahead = await stack.create_job(params={"render_s": 600})
        behind = await stack.create_job(params={"render_s": 0.1})
        await stack.wait_for_status(ahead["id"], "processing")
        await wait_until(lambda: _parked(database_url, behind["id"]), within=10, what="the job behind to park")
        # The slot comes free with no event at all: as if the wake-up had been lost with its message.
        await _fetch(database_url, "UPDATE jobs SET status = 'failed', recover_at = NULL, deadline_at = NULL "
                                   "WHERE id = $1", ahead["id"])
        done = await stack.wait_terminal(behind["id"], within=30)

    assert done["status"] == "completed"


async def _holds_nothing(watch: Watch, consumer: str) -> bool:
    return (await watch.deliveries(consumer))[0] == 0


async def _parked(database_url: str, job_id: str) -> bool:
    rows = await _fetch(database_url, "SELECT 1 FROM jobs WHERE id = $1 AND status = 'pending' AND recover_at IS NULL",
                        job_id)
    return bool(rows)


async def _slot_wakeups(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch("SELECT payload FROM outbox WHERE subject = $1 ORDER BY id", events.SUBMIT)
    decoded = [events.decode(events.SUBMIT, bytes(r["payload"])) for r in rows]
    return sorted(e.provider for e in decoded if isinstance(e, SlotFreed))


async def _create(conn: asyncpg.Connection, account_id: str, model: str, prompt: str) -> jobs.JobRow:
    async with conn.transaction():
        return await creation.create(conn, account_id=account_id, estimated_credits=10,
                                     request=JobRequest(model=model, prompt=prompt), recovery_delay_s=3600)


async def test_a_freed_slot_wakes_the_queues_where_a_job_waits_for_it(pool):
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "slots", credits=10_000, concurrency=8)
        rendering = await _create(conn, account_id, "fake/default", "alone")
        waiting = await _create(conn, account_id, "fake/default", "waits")
        await transition(conn, rendering.id, JobStatus.SUBMITTED, reason="test")
        await conn.execute("DELETE FROM outbox")

        # Nobody waits for a fake slot but `waiting` itself: its render finishing wakes the queue.
        await transition(conn, rendering.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == ["fake"]
        await conn.execute("DELETE FROM outbox")

        # The account also waits at another provider, where its cap may have held it back: that one too.
        elsewhere = await _create(conn, account_id, "fake-poll/default", "elsewhere")
        await transition(conn, waiting.id, JobStatus.SUBMITTED, reason="test")
        await conn.execute("DELETE FROM outbox")
        await transition(conn, waiting.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == ["fake-poll"]
        await conn.execute("DELETE FROM outbox")

        # Once nothing waits, a slot that frees sends nothing.
        await transition(conn, elsewhere.id, JobStatus.CANCELED, reason="test")
        finished = await _create(conn, account_id, "fake/default", "last")
        await transition(conn, finished.id, JobStatus.SUBMITTED, reason="test")
        await transition(conn, finished.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == []


async def test_parking_stops_the_recovery_checks_until_the_job_is_submitted(pool):
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "parking", credits=10_000, concurrency=1)
        job = await _create(conn, account_id, "fake/default", "parks")
        async with conn.transaction():
            await waiting.set_wait_reason(conn, job.id, "fake already has 1 renders in flight, its limit", park=True)
        parked = await jobs.fetch(conn, job.id)
        async with conn.transaction():
            await waiting.set_wait_reason(conn, job.id, "pacing submissions", park=False)
        paced = await jobs.fetch(conn, job.id)

    assert parked is not None and parked.recover_at is None and parked.wait_reason.startswith("fake already")
    assert isinstance(parked.waited_at, datetime)
    assert paced is not None and paced.recover_at is None  # pacing keeps what it found, and sets nothing
