"""A job's deletion. Deletion is not a status: `deleted_at` hides the job from every read at once, and every
consumer treats a deleted job as terminal.

A live job is first canceled through `transition` (reason "deleted"), so its trail says where the render
went, and the move's own follow-ups settle its credit and hand its render slot on, exactly as a cancel's do.
A finished job keeps its status and its trail as they were."""

from __future__ import annotations

import asyncpg

from vidjobs.common import cancels, changes, outbox
from vidjobs.common.events import AssetsDeleteRequested

# The reason a deleted live job's move to canceled carries in its trail.
REASON = "deleted"

# Locks the account's row of the job for the rest of the transaction: no worker moves it between the cancel
# and the hiding.
_OWNED = "SELECT id FROM jobs WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL FOR UPDATE"

_HIDE = """
UPDATE jobs SET deleted_at = clock_timestamp(), updated_at = clock_timestamp(), recover_at = NULL
WHERE id = $1 AND deleted_at IS NULL
RETURNING updated_at
"""


async def soft_delete(conn: asyncpg.Connection, job_id: str, account_id: str) -> bool:
    """End the job if it was live (a cancel: its credit settled, its render stopped at the provider, its slot
    handed on), set its `deleted_at`, and ask for its assets to be removed, in one transaction. False if the
    account has no such job (or deleted it already)."""
    async with changes.after_commit(), conn.transaction():
        if await conn.fetchval(_OWNED, job_id, account_id) is None:
            return False
        # None when it had ended already: nothing to settle or stop.
        await cancels.cancel(conn, job_id, reason=REASON)
        hidden_at = await conn.fetchval(_HIDE, job_id)
        await outbox.add(conn, [AssetsDeleteRequested(job_id=job_id)])
        changes.note(job_id, "deleted", hidden_at)
    return True
