"""The webhook inbox (a table the gateway owns): a verified callback about a render of ours is stored once per
delivery id, raw and as the signal the gateway read from it, with the message that has the poller act on that
signal; old rows are pruned.

A callback is stored only when it may be about a render of ours. The check is one indexed read, so a
flood of bodies that name nothing of ours costs no write, no stream message and no poller delivery.
"""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common import inflight, outbox
from vidjobs.common.events import InboxReceived
from vidjobs.common.states import TERMINAL
from vidjobs.providers.base import ProviderSignal

# A submit still unanswered after this long is not waiting for its answer any more.
IN_FLIGHT_S = 600.0
PRUNE_BATCH = 5000

_TERMINAL = sorted(s.value for s in TERMINAL)

# $1 provider, $2 our job id (callbacks that carry it), $3 the provider's render id, $4 verified, $5 window.
# A verified signal naming our job id may be about a render the job gave up on, which the poller then
# stops, so any job of that provider counts; so does a job id no row holds, since only we start renders
# calling back here with our ids: its row was lost (a failover to an asynchronous standby), and the poller
# stops that render too. A render id counts while a live job uses it. A verified callback may also come
# before the submitter has recorded the render id, while a submit is in flight.
_KNOWN = f"""
SELECT ($2::text IS NOT NULL AND $4 AND (EXISTS (SELECT 1 FROM jobs WHERE id = $2 AND provider = $1)
                                         OR NOT EXISTS (SELECT 1 FROM jobs WHERE id = $2)))
    OR EXISTS (SELECT 1 FROM jobs WHERE provider = $1 AND provider_job_id = $3::text
               AND deleted_at IS NULL AND status <> ALL($6::job_status[]))
    OR ($4 AND EXISTS (SELECT 1 FROM provider_submissions WHERE provider = $1
                       AND {inflight.unanswered_call("$5")}))
"""


async def is_known(conn: asyncpg.Connection | asyncpg.Pool, provider: str, sig: ProviderSignal) -> bool:
    """Whether `sig` (a parsed callback) may be about a render we started with `provider`."""
    return bool(await conn.fetchval(_KNOWN, provider, sig.job_id, sig.provider_job_id, sig.verified,
                                    IN_FLIGHT_S, _TERMINAL))


async def store(conn: asyncpg.Connection, provider: str, webhook_id: str, raw: bytes, sig: ProviderSignal) -> bool:
    """Store a delivery and stage its message, in the caller's transaction; False if it is already here.

    `sig` is what the gateway parsed from `raw`: the poller acts on it as stored and parses nothing again. The
    raw body is still written: a poller of the release before, during a rollout, reads only that."""
    inbox_id = await conn.fetchval(
        """
        INSERT INTO webhook_inbox (provider, webhook_id, payload, signal) VALUES ($1, $2, $3, $4::text::jsonb)
        ON CONFLICT (provider, webhook_id) DO NOTHING
        RETURNING id
        """,
        provider, webhook_id, raw, msgspec.json.encode(sig).decode(),
    )
    if inbox_id is None:
        return False
    await outbox.add(conn, [InboxReceived(inbox_id=inbox_id, provider=provider)])
    return True


async def prune(pool: asyncpg.Pool, retention_days: float) -> int:
    """Delete rows received longer ago than `retention_days`, in batches; how many went."""
    removed = 0
    while True:
        status = await pool.execute(
            """
            DELETE FROM webhook_inbox WHERE id IN (
                SELECT id FROM webhook_inbox WHERE received_at < now() - make_interval(secs => $1 * 86400) LIMIT $2)
            """,
            retention_days, PRUNE_BATCH,
        )
        count = int(status.split()[-1])
        removed += count
        if count < PRUNE_BATCH:
            return removed
