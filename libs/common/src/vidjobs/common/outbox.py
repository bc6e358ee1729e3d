"""The transactional outbox: events are written in the same transaction as the state they describe, and a
relay publishes them to JetStream with `Nats-Msg-Id` naming the row: its id and the moment it was made.

A crash between commit and publish leaves the row for the next relay pass; a crash between publish and
delete republishes under the same id, which JetStream's duplicate window drops. Nothing is lost or doubled.
The moment is in the id because the number alone does not name one row for ever: after a failover to an
asynchronous standby the id sequence starts again below numbers the lost primary used and published, and a
new event under such a number would be dropped as a duplicate of the lost one (tests/test_outbox_ids.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import asyncpg
from nats.js import JetStreamContext

from vidjobs.common import events, metrics, requestids
from vidjobs.common.events import Event
from vidjobs.common.waits import set_within

log = logging.getLogger("vidjobs.outbox")

MAX_BACKOFF_S = 5.0


async def add(conn: asyncpg.Connection, items: Sequence[Event]) -> None:
    """Stage events for publishing; call inside the transaction that made them true."""
    if not items:
        return
    # One statement however many events; `unnest` keeps their order, and so their ids. The request being
    # worked on goes with them (requestids).
    await conn.execute(
        "INSERT INTO outbox (subject, payload, request_id) SELECT s, p, $3 FROM unnest($1::text[], $2::bytea[]) "
        "AS e (s, p)",
        [events.subject_for(e) for e in items], [events.encode(e) for e in items], requestids.current(),
    )


class Relay:
    """Publishes outbox rows. Any process may run one; `SKIP LOCKED` lets several share the table."""

    def __init__(self, pool: asyncpg.Pool, js: JetStreamContext, *, batch: int = 256, idle_s: float = 0.5):
        self._pool = pool
        self._js = js
        self._batch = batch
        self._idle_s = idle_s
        self._wake = asyncio.Event()
        self._last_pass = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the relay last finished a pass, failed or not: large only when it is wedged."""
        return time.monotonic() - self._last_pass

    def poke(self) -> None:
        """Something was just committed: publish now rather than at the next idle tick."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                sent = await self.publish_pending()
                failures = 0
            except Exception as exc:
                # Whatever JetStream or the database says (no responders while a leader is elected, a
                # connection lost, a timeout), the rows stay and the next pass publishes them.
                failures += 1
                delay = min(self._idle_s * 2 ** min(failures, 6), MAX_BACKOFF_S)
                log.warning("outbox relay pass failed; retrying", extra={"error": repr(exc), "delay_s": delay})
                metrics.OUTBOX_FAILURES.inc()
                sent = 0
                await asyncio.sleep(delay)
            self._last_pass = time.monotonic()
            if sent >= self._batch:
                continue  # more may be waiting
            self._wake.clear()
            await set_within(self._wake, self._idle_s)

    async def publish_pending(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT id, subject, payload, request_id, (extract(epoch FROM created_at) * 1e6)::bigint AS made_us "
                "FROM outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
                self._batch,
            )
            if not rows:
                return 0
            await asyncio.gather(*(self._publish(r) for r in rows))
            await conn.execute("DELETE FROM outbox WHERE id = ANY($1::bigint[])", [r["id"] for r in rows])
        metrics.OUTBOX_PUBLISHED.inc(len(rows))
        return len(rows)

    async def _publish(self, row: asyncpg.Record) -> None:
        headers = {"Nats-Msg-Id": f"outbox-{row['id']}-{row['made_us']}"}
        if row["request_id"] is not None:
            headers[requestids.MESSAGE_HEADER] = row["request_id"]
        await self._js.publish(row["subject"], bytes(row["payload"]), headers=headers, timeout=5)
