"""Questions the fault suite asks JetStream directly: is it answering, who leads the work stream, how much
does the submitter's consumer hold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo

from vidjobs.common.bus import WORK_STREAM


@contextlib.asynccontextmanager
async def jetstream(urls: list[str]) -> AsyncIterator[tuple[NATS, JetStreamContext]]:
    nc = await nats.connect(urls, name="vidjobs-faults", max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                            connect_timeout=5)
    try:
        yield nc, nc.jetstream(timeout=5)
    finally:
        await nc.close()


async def wait_jetstream(urls: list[str], within_s: float = 30.0) -> None:
    """A cluster's JetStream answers only once its meta leader is elected, some time after every node is up."""
    async with jetstream(urls) as (_, js):
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            try:
                await js.account_info()
                return
            except (nats.errors.Error, TimeoutError):
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.25)


async def work_stream_leader(js: JetStreamContext) -> str | None:
    info = await js.stream_info(WORK_STREAM)
    return info.cluster.leader if info.cluster else None


async def step_down_work_leader(nc: NATS) -> None:
    await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{WORK_STREAM}", b"", timeout=5)


async def submitter_consumer(js: JetStreamContext) -> ConsumerInfo:
    return await js.consumer_info(WORK_STREAM, "submitter")


async def work_left(urls: list[str]) -> dict[str, int]:
    """Messages of the work stream that some consumer has still to handle: waiting to be delivered, or out and
    not yet acknowledged (a deferral waiting out its delay among them). 0 means every event published has been
    handled; parked jobs hold none. By consumer, those holding any."""
    async with jetstream(urls) as (_, js):
        held = {c.name: c.num_pending + c.num_ack_pending for c in await js.consumers_info(WORK_STREAM)}
    return {name: n for name, n in held.items() if n}
