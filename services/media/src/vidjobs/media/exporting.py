"""Exports: a job's stored original PUT to a presigned URL of its owner's bucket (a `job_exports` row, asked for
at the gateway, whose `ExportRequested` reaches here through the outbox).

The object is streamed from our storage into the PUT a chunk at a time, with its length declared (S3 and its
kin refuse a presigned PUT without one), so memory stays flat whatever its size. The request goes through a
session of the request-forgery guard (netguard, purpose EXPORTS): the address is checked again as it is
connected to, whatever the gateway found when the URL was named. Redirects are not followed: a presigned PUT
has no reason to redirect, and a body is not sent twice.

A 2xx settles it `done`; a refusal by the guard or a 4xx answer (the URL expired, a signature that does not
match) `failed` at once, with the reason; a 5xx, 408, 429, a dropped connection or a timeout is tried again
(JetStream redelivers the request, with backoff) until VIDJOBS_EXPORT_ATTEMPTS tries have failed. An export
whose clip was removed meanwhile (the job deleted or expired) fails saying so. Settling clears the URL, a
credential of the owner's that is kept no longer than needed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import msgspec

from vidjobs.common import backoff, logs, netguard
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import Redeliver
from vidjobs.common.events import Event, ExportRequested
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import JobStatus
from vidjobs.storage.base import ObjectNotFound, Storage, StorageUnavailable

log = logging.getLogger("vidjobs.media")

CHUNK_BYTES = 1 << 20
READ_LIMIT = 4096  # of the destination's answer: enough for an S3 error document
MIN_SEND_RATE = 256 * 1024  # bytes a second: an attempt gets its length at this rate on top of a fixed minute
BASE_S = 60.0
_RETRIED = frozenset({408, 429})
_S3_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A pending export with what it copies: the job's stored video, unless it is gone."""

    job_id: str
    account_id: str
    url: str
    host: str
    job_status: JobStatus
    job_deleted: bool
    key: str | None  # None once the video was removed
    bytes: int | None
    content_type: str | None


class Failed(Exception):
    """One try failed; `final` when another would fail alike."""

    def __init__(self, reason: str, *, final: bool):
        super().__init__(reason)
        self.reason = reason
        self.final = final


_PENDING = """
SELECT e.job_id, e.account_id, e.url, e.host, j.status AS job_status, j.deleted_at IS NOT NULL AS job_deleted,
       a.key, a.bytes, a.content_type
FROM job_exports e JOIN jobs j ON j.id = e.job_id
LEFT JOIN assets a ON a.job_id = e.job_id AND a.kind = 'video' AND a.deleted_at IS NULL
WHERE e.id = $1 AND e.status = 'pending'
"""

# Only a pending export is settled: a duplicate delivery that finishes second changes nothing.
_SETTLE = """
UPDATE job_exports SET status = $2, reason = $3, bytes = $4, attempts = attempts + $5, url = NULL,
    finished_at = clock_timestamp()
WHERE id = $1 AND status = 'pending'
"""
_TRIED = "UPDATE job_exports SET attempts = attempts + 1, reason = $2 WHERE id = $1 AND status = 'pending'"


async def pending(pool: asyncpg.Pool, export_id: str) -> Pending | None:
    row = await pool.fetchrow(_PENDING, export_id)
    return None if row is None else msgspec.convert(dict(row), Pending)


async def settle(pool: asyncpg.Pool, export_id: str, *, done: bool, reason: str | None = None,
                 sent: int | None = None, failed_try: bool = False) -> None:
    await pool.execute(_SETTLE, export_id, "done" if done else "failed", reason, sent, int(failed_try))


def attempt_s(size: int) -> float:
    return BASE_S + size / MIN_SEND_RATE


def removed_reason(found: Pending) -> str | None:
    """Why there is nothing to copy any more, if there is not."""
    if found.job_deleted:
        return "The job was deleted before its clip could be exported."
    if found.job_status is not JobStatus.COMPLETED or found.key is None:
        return ("The clip was removed (its retention ran out) before it could be exported; a kept clip stays "
                "to be exported.")
    return None


async def _chunks(storage: Storage, key: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in storage.read_chunks(key, CHUNK_BYTES):
            yield chunk
    except ObjectNotFound as exc:
        raise Failed("The clip was removed before it could be exported.", final=True) from exc


async def put(session: aiohttp.ClientSession, storage: Storage, found: Pending) -> int:
    """PUT the stored video to the export's URL; the bytes sent. Raises Failed."""
    assert found.key is not None and found.bytes is not None
    headers = {"Content-Length": str(found.bytes), "Content-Type": found.content_type or "video/mp4"}
    seconds = attempt_s(found.bytes)
    try:
        async with asyncio.timeout(seconds), session.put(
                found.url, data=_chunks(storage, found.key), headers=headers, allow_redirects=False) as resp:
            answer = await resp.content.read(READ_LIMIT)
            status = resp.status
    except netguard.UnsafeDestination as exc:
        raise Failed(str(exc), final=True) from exc
    except TimeoutError as exc:
        raise Failed(f"{found.host} did not take the clip within {seconds:.0f} s.", final=False) from exc
    except aiohttp.ClientError as exc:
        # What went wrong while the body was read from our store travels as the request's cause.
        if isinstance(exc.__cause__, Failed | StorageUnavailable):
            raise exc.__cause__ from exc
        raise Failed(f"The connection to {found.host} failed ({type(exc).__name__}).", final=False) from exc
    if 200 <= status < 300:
        return found.bytes
    raise Failed(_answer_reason(found.host, status, answer), final=status < 500 and status not in _RETRIED)


def _answer_reason(host: str, status: int, answer: bytes) -> str:
    code = _S3_CODE.search(answer)
    named = f" ({code.group(1).decode()})" if code else ""
    if 300 <= status < 400:
        return f"{host} answered HTTP {status}{named}, a redirect; a presigned PUT URL is put to as it is."
    return f"{host} answered HTTP {status}{named} to the PUT."


async def on_export(rt: Runtime, session: aiohttp.ClientSession, storage: Storage, event: ExportRequested,
                    delivery: Delivery) -> None:
    found = await pending(rt.pool, event.export_id)
    if found is None:
        return  # settled already (a duplicate delivery), or its job's rows are gone
    logs.about_job(found.job_id, found.account_id)
    extra = {"job_id": found.job_id, "export_id": event.export_id, "host": found.host, "attempt": delivery.attempt}
    if (gone := removed_reason(found)) is not None:
        await settle(rt.pool, event.export_id, done=False, reason=gone)
        log.info("export failed: nothing left to copy", extra=extra)
        return
    try:
        sent = await put(session, storage, found)
    except Failed as err:
        await _failed(rt, event.export_id, err, delivery, extra)
        return
    await settle(rt.pool, event.export_id, done=True, sent=sent)
    log.info("clip exported", extra={**extra, "bytes": sent})


async def _failed(rt: Runtime, export_id: str, err: Failed, delivery: Delivery, extra: dict[str, object]) -> None:
    settings = rt.settings
    if not err.final and delivery.attempt < settings.export_attempts:
        await rt.pool.execute(_TRIED, export_id, err.reason)
        log.warning("export try failed; it will be tried again", extra={**extra, "error": err.reason})
        delay = backoff.delay(delivery.attempt, base=settings.retry_base_s, cap=settings.retry_cap_s)
        raise Redeliver(err.reason, delay=delay, counts=True)
    await settle(rt.pool, export_id, done=False, reason=err.reason, failed_try=True)
    log.warning("export failed", extra={**extra, "error": err.reason})


async def on_dead(rt: Runtime, event: Event) -> None:
    """Its request kept failing on our side (the store unreachable, say) until its tries ran out."""
    if isinstance(event, ExportRequested):
        await settle(rt.pool, event.export_id, done=False,
                     reason="Exporting kept failing on our side and was stopped; ask for the export again.")
