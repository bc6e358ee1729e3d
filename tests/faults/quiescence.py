"""Quiescence: nothing left to happen, the moment to check a history (checker.py). Every event published and
handled, every delivery to an endpoint that answers settled, every deleted job's files removed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import asyncpg

from tests.faults.history import History
from tests.faults.jsapi import work_left

if TYPE_CHECKING:
    from tests.faults.harness import FaultRun

# Recovery checks wait out their delay in JetStream (up to VIDJOBS_RECOVERY_QUIET_S after a callback) and find
# a terminal job done when they come due: they change nothing more, so quiescence does not wait for them.
RECOVERY_CONSUMER = "reaper-recovery"


async def left_to_happen(run: FaultRun, history: History, *, answering: set[str] | None = None) -> dict[str, int]:
    """What could still happen, by what, with only what is nonzero: work messages unhandled per consumer,
    outbox rows unpublished, deliveries pending to the endpoints that answer (`answering`; default every
    endpoint of the history: one failing by design retries for hours), files of deleted jobs not removed."""
    held = await work_left(run.stack.settings.nats_url.split(","))
    held.pop(RECOVERY_CONSUMER, None)
    conn = await asyncpg.connect(run.database_url)
    try:
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM outbox) AS outbox, "
            "(SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND endpoint_id = ANY($1)) "
            "AS deliveries, "
            "(SELECT count(*) FROM assets WHERE job_id = ANY($2) AND deleted_at IS NULL) AS deleted_files",
            list(history.endpoints if answering is None else answering), list(history.deleted))
    finally:
        await conn.close()
    left = {**{f"messages for {name}": n for name, n in held.items()}, **dict(row)}
    return {k: n for k, n in left.items() if n}


async def settle(run: FaultRun, history: History, *, within_s: float = 30,
                 answering: set[str] | None = None) -> None:
    """Wait for quiescence; fail saying what is left if it does not come within `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while left := await left_to_happen(run, history, answering=answering):
        assert loop.time() < deadline, f"not quiescent after {within_s:.0f}s: {left}"
        await asyncio.sleep(0.2)


async def pending_deliveries(run: FaultRun, endpoints: set[str], limit: int = 8) -> list[dict]:
    """The deliveries still pending to `endpoints`, oldest first, with where each stands: for a report of
    what kept a run from quiescence."""
    conn = await asyncpg.connect(run.database_url)
    try:
        rows = await conn.fetch(
            "SELECT id, job_id, event_type, attempts, last_status, last_error, "
            "round(extract(epoch FROM next_attempt_at - now())::numeric, 1) AS due_in_s, "
            "round(extract(epoch FROM claimed_until - now())::numeric, 1) AS claimed_for_s, "
            "round(extract(epoch FROM now() - created_at)::numeric, 1) AS age_s "
            "FROM webhook_deliveries WHERE status = 'pending' AND endpoint_id = ANY($1) "
            "ORDER BY created_at LIMIT $2", list(endpoints), limit)
    finally:
        await conn.close()
    return [dict(r) for r in rows]
