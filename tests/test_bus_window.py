"""How much work a consumer takes at once is set by its processes, not by a window JetStream shares among them.

Every replica of a worker pulls only as many messages as it has free handlers. JetStream's `max_ack_pending`
caps the messages a consumer has out across every replica together, and a message handed back with a delay
(a failed download waiting out its backoff, a deferred copy held until it is due) counts against it for the
whole wait. A small window would make replicas past the first few idle, and let a few jobs in backoff stop
every other job on the subject."""

from __future__ import annotations

import asyncio
import contextlib

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.support import wait_until
from vidjobs.common import bus, events
from vidjobs.common.errors import Redeliver
from vidjobs.common.events import DownloadRequested

SUBJECT = events.DOWNLOAD
DURABLE = "test-window"


class Handlings:
    """Handlers that hold on until released, counting how many run at once, or hand stuck jobs back."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.done: list[str] = []
        self.stuck: set[str] = set()
        self.release = asyncio.Event()

    async def hold(self, event: DownloadRequested, delivery: bus.Delivery) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1

    def at_least(self, n: int):
        async def check() -> bool:
            return self.most >= n
        return check

    async def backoff_if_stuck(self, event: DownloadRequested, delivery: bus.Delivery, *, counts: bool) -> None:
        if event.job_id.startswith("job_stuck"):
            # A provider whose CDN is failing: the copy is retried in two minutes.
            self.stuck.add(event.job_id)
            raise Redeliver("the provider's CDN answered 503", delay=120.0, counts=counts)
        self.done.append(event.job_id)


@contextlib.asynccontextmanager
async def replicas(nats_url: str, handler, *, count: int, concurrency: int):
    """`count` worker processes' worth of consumers on one durable, each on its own connection."""
    conns = [await nats.connect(nats_url) for _ in range(count)]
    await bus.ensure_streams(conns[0].jetstream())
    stop = asyncio.Event()
    spec = bus.ConsumerSpec(durable=DURABLE, subject=SUBJECT, handler=handler, concurrency=concurrency,
                            ack_wait_s=30.0)
    tasks = [asyncio.create_task(bus.consume(nc.jetstream(), spec, stop)) for nc in conns]
    try:
        yield conns[0].jetstream()
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for nc in conns:
            await nc.close()


async def _publish(js, *job_ids: str) -> None:
    for job_id in job_ids:
        await js.publish(SUBJECT, events.encode(DownloadRequested(job_id=job_id)))


async def test_every_replica_adds_handlers(nats_url):
    handlings = Handlings()
    async with replicas(nats_url, handlings.hold, count=6, concurrency=1) as js:
        await _publish(js, *(f"job_{i}" for i in range(8)))
        await wait_until(handlings.at_least(6), within=20, what="six replicas handling at once")
        handlings.release.set()
    assert handlings.most == 6  # one each: no replica takes more than its own handlers


@pytest.mark.parametrize("counts", [True, False], ids=["failed-try", "deferral"])
async def test_work_waiting_out_a_delay_does_not_hold_back_other_work(nats_url, counts):
    handlings = Handlings()

    async def handler(event, delivery):
        await handlings.backoff_if_stuck(event, delivery, counts=counts)

    async with replicas(nats_url, handler, count=1, concurrency=2) as js:
        await _publish(js, *(f"job_stuck_{i}" for i in range(12)))

        async def all_stuck() -> bool:
            return len(handlings.stuck) == 12

        await wait_until(all_stuck, within=15, what="every stuck job tried once, none held back by the others")
        await _publish(js, "job_fresh")

        async def fresh_handled() -> bool:
            return "job_fresh" in handlings.done

        await wait_until(fresh_handled, within=15, what="a fresh job handled while others wait out a backoff")


async def test_a_window_an_earlier_release_left_is_widened(nats_url):
    """The consumer as the previous release created it (4 × concurrency) is brought up to the spec at start."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js)
        await js.add_consumer(bus.WORK_STREAM, config=ConsumerConfig(
            durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0, filter_subject=SUBJECT,
            max_ack_pending=4))
        handlings = Handlings()
        async with replicas(nats_url, handlings.hold, count=6, concurrency=1) as js6:
            await _publish(js6, *(f"job_{i}" for i in range(8)))
            await wait_until(handlings.at_least(6), within=20, what="six replicas handling at once")
            handlings.release.set()
        info = await js.consumer_info(bus.WORK_STREAM, DURABLE)
        assert info.config.max_ack_pending == bus.ACK_WINDOW
    finally:
        await nc.close()

