"""Exports of a ready job's stored original to a URL of the account's own (a presigned PUT of its bucket): the
`job_exports` rows as the gateway writes and reads them. The media service copies and settles them
(vidjobs.media.exporting); the row and its request in the outbox commit together, so none is lost.

The URL is kept only while the export is pending (it is a credential for the account's bucket); its host is
shown with the status. An account has at most VIDJOBS_MAX_EXPORTS_IN_FLIGHT exports pending at once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import asyncpg
import msgspec

from vidjobs.common import ids, outbox
from vidjobs.common.events import ExportRequested
from vidjobs.common.states import JobStatus

Conn = asyncpg.Connection | asyncpg.Pool
ExportStatus = Literal["pending", "done", "failed"]


class ExportRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    job_id: str
    host: str
    status: ExportStatus
    reason: str | None
    attempts: int
    bytes: int | None
    created_at: datetime
    finished_at: datetime | None


class NotExportable(Exception):
    """Only a ready (completed) job's original is stored to export; `status` is the job's."""

    def __init__(self, status: JobStatus):
        super().__init__(status.value)
        self.status = status


class TooManyExports(Exception):
    def __init__(self, limit: int):
        super().__init__(f"{limit} exports pending")
        self.limit = limit


_COLUMNS = "e.id, e.job_id, e.host, e.status, e.reason, e.attempts, e.bytes, e.created_at, e.finished_at"

_INSERT = f"""
INSERT INTO job_exports AS e (id, job_id, account_id, url, host) VALUES ($1, $2, $3, $4, $5)
RETURNING {_COLUMNS}
"""

_ONE = f"""
SELECT {_COLUMNS} FROM job_exports e JOIN jobs j ON j.id = e.job_id
WHERE e.id = $1 AND e.job_id = $2 AND e.account_id = $3 AND j.deleted_at IS NULL
"""

_OF_JOB = f"""
SELECT {_COLUMNS} FROM job_exports e JOIN jobs j ON j.id = e.job_id
WHERE e.job_id = $1 AND e.account_id = $2 AND j.deleted_at IS NULL
ORDER BY e.created_at DESC, e.id DESC LIMIT $3
"""


def _row(record: asyncpg.Record) -> ExportRow:
    return ExportRow(**dict(record))


async def start(conn: asyncpg.Connection, account_id: str, job_id: str, url: str, host: str, *,
                max_pending: int) -> ExportRow | None:
    """Record the export and queue its copy; None if the account has no such job. Raises NotExportable,
    TooManyExports. Call in a transaction: the account's lock is held until it ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('exports:' || $1))", account_id)
    status = await conn.fetchval("SELECT status FROM jobs WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
                                 job_id, account_id)
    if status is None:
        return None
    if JobStatus(status) is not JobStatus.COMPLETED:
        raise NotExportable(JobStatus(status))
    pending = await conn.fetchval("SELECT count(*) FROM job_exports WHERE account_id = $1 AND status = 'pending'",
                                  account_id)
    if pending >= max_pending:
        raise TooManyExports(max_pending)
    inserted = await conn.fetchrow(_INSERT, ids.new("exp"), job_id, account_id, url, host)
    assert inserted is not None, "an INSERT ... RETURNING answers its row"
    made = _row(inserted)
    await outbox.add(conn, [ExportRequested(export_id=made.id, job_id=job_id)])
    return made


async def one(conn: Conn, account_id: str, job_id: str, export_id: str) -> ExportRow | None:
    found = await conn.fetchrow(_ONE, export_id, job_id, account_id)
    return None if found is None else _row(found)


async def of_job(conn: Conn, account_id: str, job_id: str, limit: int) -> list[ExportRow]:
    return [_row(r) for r in await conn.fetch(_OF_JOB, job_id, account_id, limit)]
