"""Delivery counts that decide dead-lettering live in JetStream, not in a process: deferrals spend nothing
however many there are, failures and handlings that die with their process spend one try each, and a consumer
that is stopped and started again (a restarted process) goes on counting where the last one left off."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import nats
import pytest

from tests.support import wait_until
from vidjobs.common import bus, events
from vidjobs.common.errors import Redeliver
from vidjobs.common.events import JobQueued

SUBJECT = events.SUBMIT


class Recorder:
    """A handler whose behaviour per job is scripted; it records every handling and what it was told."""

    def __init__(self, script):
        self.script = script
        self.seen: Counter = Counter()
        self.attempts: dict[str, list[int]] = {}
        self.dead: list[str] = []

    async def handle(self, event, delivery: bus.Delivery) -> None:
        self.seen[event.job_id] += 1
        self.attempts.setdefault(event.job_id, []).append(delivery.attempt)
        await self.script(event.job_id, self.seen[event.job_id])

    async def on_dead(self, event) -> None:
        self.dead.append(event.job_id)


@contextlib.asynccontextmanager
async def consuming(nats_url: str, recorder: Recorder, *, max_deliver: int = 3, ack_wait_s: float = 2.0):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await bus.ensure_streams(js)
    spec = bus.ConsumerSpec(durable="test-tries", subject=SUBJECT, handler=recorder.handle, concurrency=4,
                            ack_wait_s=ack_wait_s, max_deliver=max_deliver, on_dead=recorder.on_dead)
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(js, spec, stop))
    try:
        yield js
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()


async def test_deferrals_spend_no_tries(nats_url):
    async def script(job_id: str, n: int) -> None:
        if n <= 12:
            raise Redeliver("waiting for a slot", delay=0.01)

    recorder = Recorder(script)
    async with consuming(nats_url, recorder) as js:
        await js.publish(SUBJECT, events.encode(JobQueued(job_id="job_waits")))
        await wait_until(lambda: _at_least(recorder, "job_waits", 13), within=30, what="13 handlings")
        await asyncio.sleep(0.5)

    assert recorder.dead == []
    assert recorder.attempts["job_waits"] == [1] * 13  # deferred twelve times, never a failed try


async def test_failures_are_counted_and_dead_lettered(nats_url):
    async def script(job_id: str, n: int) -> None:
        raise RuntimeError("this job's work always fails")

    recorder = Recorder(script)
    async with consuming(nats_url, recorder, max_deliver=3) as js:
        await js.publish(SUBJECT, events.encode(JobQueued(job_id="job_fails")))
        await wait_until(lambda: _dead(recorder), within=30, what="a dead letter")

    assert recorder.attempts["job_fails"] == [1, 2, 3]


async def test_lost_handlings_count_across_restarts(nats_url):
    """Each handling 'dies with its process': the consumer is torn down mid-handling and a new one started,
    as a restarted process would. The count goes on, and the message is dead-lettered, not handled forever."""
    started = asyncio.Event()

    async def script(job_id: str, n: int) -> None:
        started.set()
        await asyncio.sleep(3600)  # never answers: only the ack wait brings it back

    recorder = Recorder(script)
    published = False
    for _ in range(6):
        started.clear()
        async with consuming(nats_url, recorder, max_deliver=3, ack_wait_s=1.0) as js:
            if not published:
                await js.publish(SUBJECT, events.encode(JobQueued(job_id="job_kills")))
                published = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(started.wait(), 6)
            if recorder.dead:
                break
    assert recorder.dead == ["job_kills"]
    assert recorder.attempts["job_kills"] == [1, 2, 3]


@pytest.mark.parametrize("deferrals", [1, 4])
async def test_a_deferred_copy_keeps_the_count(nats_url, deferrals):
    """Failed, then deferred (a copy replaces the message), then failed again: the copy carries the count."""

    async def script(job_id: str, n: int) -> None:
        if n == 1 or n > 1 + deferrals:
            raise RuntimeError("failed")
        raise Redeliver("not yet", delay=0.01)

    recorder = Recorder(script)
    async with consuming(nats_url, recorder, max_deliver=3) as js:
        await js.publish(SUBJECT, events.encode(JobQueued(job_id="job_mixed")))
        await wait_until(lambda: _dead(recorder), within=30, what="a dead letter")

    attempts = recorder.attempts["job_mixed"]
    assert attempts == [1] + [2] * deferrals + [2, 3]


async def _at_least(recorder: Recorder, job_id: str, n: int) -> bool:
    return recorder.seen[job_id] >= n


async def _dead(recorder: Recorder) -> bool:
    return bool(recorder.dead)


async def test_a_consumer_stopped_mid_fetch_leaves_no_subscription_to_drain(nats_url):
    """A service cancels its consumers at shutdown; a pull subscription left behind made the connection's
    drain wait out its whole timeout (30 s by default) on every stop."""
    nc = await nats.connect(nats_url, drain_timeout=3)
    js = nc.jetstream()
    await bus.ensure_streams(js)
    spec = bus.ConsumerSpec(durable="test-stop", subject=SUBJECT, handler=Recorder(None).handle)
    task = asyncio.create_task(bus.consume(js, spec, asyncio.Event()))
    before = len(nc._subs)
    await wait_until(lambda: _more(nc, before), within=10, what="the consumer to subscribe")
    await asyncio.sleep(0.2)  # inside a fetch
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert len(nc._subs) == before
    await nc.drain()


async def _more(nc, before: int) -> bool:
    return len(nc._subs) > before
