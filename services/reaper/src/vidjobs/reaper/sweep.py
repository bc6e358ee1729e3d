"""The safety net under the recovery messages: PostgreSQL knows when every live job is due, so a check
whose message was lost (or never published) is published again. Duplicates are harmless: JetStream drops
the same message id inside its window, and the recovery check drops superseded ones."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from functools import partial

from nats.js import JetStreamContext

from vidjobs.common import events
from vidjobs.common.events import RecoveryDue
from vidjobs.common.runtime import Runtime, every
from vidjobs.reaper import leases

log = logging.getLogger("vidjobs.reaper")

OVERDUE_S = 15.0


# Through jobs_recover_due, which holds only live jobs: finished ones have no recovery time.
OVERDUE_SQL = """
    SELECT id, recover_at FROM jobs
    WHERE recover_at < clock_timestamp() - make_interval(secs => $1)
    ORDER BY recover_at LIMIT $2
"""


async def republish_overdue(rt: Runtime, *, limit: int = 500) -> int:
    rows = await rt.pool.fetch(OVERDUE_SQL, OVERDUE_S, limit)
    await asyncio.gather(*(_publish(rt.js, r["id"], r["recover_at"]) for r in rows))
    if rows:
        log.warning("republished overdue recovery checks", extra={"count": len(rows)})
    return len(rows)


async def _publish(js: JetStreamContext, job_id: str, due: datetime) -> None:
    event = RecoveryDue(job_id=job_id, due_at=due)
    msg_id = f"recover-{job_id}-{due.timestamp():.6f}"
    await js.publish(events.RECOVERY, events.encode(event), headers={"Nats-Msg-Id": msg_id}, timeout=5)


async def sweep_once(rt: Runtime) -> None:
    await republish_overdue(rt)
    await leases.purge_expired(rt.pool)


async def run(rt: Runtime, *, every_s: float = 5.0) -> None:
    await every(rt, every_s, partial(sweep_once, rt), "recovery sweep")
