"""An outbox row's message id names that row, not just its number. After a failover to an asynchronous standby
the outbox's sequence starts again below numbers the lost primary already used and published (a sequence is
logged ahead of use, but not past what the standby never received), so a new event may get the id of one
JetStream saw within its duplicate window. It must still be delivered; a row published twice (a crash between
publish and delete) must still be delivered once."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import nats

from vidjobs.common import bus, events
from vidjobs.common.events import DownloadRequested
from vidjobs.common.outbox import Relay


async def _row(pool: asyncpg.Pool, row_id: int, job_id: str, made_at: datetime | None = None) -> datetime:
    """An outbox row with the given id (as the sequence of a promoted standby may hand it out), made now or at
    `made_at` (the same row again); when it was made."""
    event = DownloadRequested(job_id=job_id)
    return await pool.fetchval(
        "INSERT INTO outbox (id, subject, payload, created_at) VALUES ($1, $2, $3, coalesce($4, clock_timestamp())) "
        "RETURNING created_at", row_id, events.subject_for(event), events.encode(event), made_at)


async def _delivered(js, subject: str) -> list[str]:
    """Everything on `subject`, read until a second passes without more (the first read waits longer: a slow
    machine may take more than a second to answer at all)."""
    sub = await js.pull_subscribe(subject, durable="outbox-ids", stream=bus.WORK_STREAM)
    seen = []
    try:
        while True:
            for msg in await sub.fetch(10, timeout=1 if seen else 10):
                seen.append(events.decode(subject, msg.data).job_id)
                await msg.ack()
    except TimeoutError:
        # nats.errors.TimeoutError is one, but fetch also raises asyncio's own when its deadline ran out
        # before it could send its waiting request.
        return seen


async def test_a_reused_outbox_id_is_a_new_message_and_a_republished_row_is_not(pool, nats_url):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js)
        relay = Relay(pool, js)
        made_at = await _row(pool, 1000, "job_before_failover")
        assert await relay.publish_pending() == 1
        # The same row published again, as after a crash between publish and delete: dropped as a duplicate.
        await _row(pool, 1000, "job_before_failover", made_at)
        assert await relay.publish_pending() == 1
        # Another event under the same number, as the promoted server's sequence hands it out again.
        await _row(pool, 1000, "job_after_failover")
        assert await relay.publish_pending() == 1
        subject = events.subject_for(DownloadRequested(job_id="x"))
        delivered = await _delivered(js, subject)
    finally:
        await nc.close()

    assert delivered == ["job_before_failover", "job_after_failover"]
