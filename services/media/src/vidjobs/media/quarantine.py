"""Uploaded images in quarantine: the gateway stored the raw bytes and recorded the upload as `processing`;
here they are decoded and cleaned (imagedecode), the clean image stored under the upload's key, the upload
marked `ready` or `rejected`, and the quarantined bytes removed.

Every step may run twice. The clean image is stored before the row is marked (a crash between leaves an
upload still processing, and the redelivered message stores the same image again); the quarantined bytes are
removed after (a crash between leaves them for the next delivery, which finds the upload no longer processing
and removes them, or for the orphan sweep). A message whose handlings keep failing (the process dies while
decoding, say) is dead-lettered and its upload rejected as `image_unprocessed`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import msgspec

from vidjobs.common import uploads
from vidjobs.common.bus import Delivery
from vidjobs.common.events import Event, UploadReceived
from vidjobs.common.imageheaders import ImageRefused, Refusal
from vidjobs.common.runtime import Runtime
from vidjobs.common.uploads import REASON_UNPROCESSED, UploadRow, UploadStatus
from vidjobs.media import imagedecode, media_metrics
from vidjobs.storage import integrity
from vidjobs.storage.base import ObjectNotFound, Storage, quarantine_key

log = logging.getLogger("vidjobs.media")


@dataclass
class Quarantine:
    rt: Runtime
    storage: Storage
    # Decodes at once in this process: each may hold a few hundred MB at the pixel limit.
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))

    @classmethod
    def of(cls, rt: Runtime, storage: Storage) -> Quarantine:
        return cls(rt=rt, storage=storage, slots=asyncio.Semaphore(max(1, rt.settings.upload_decode_slots)))


async def on_upload_received(q: Quarantine, event: UploadReceived, delivery: Delivery) -> None:
    upload = await uploads.fetch(q.rt.pool, event.upload_id)
    if upload is None:
        # Deleted (or expired) before it was decoded: whatever is left under its prefix is the sweep's.
        log.info("upload gone before it was decoded", extra={"upload_id": event.upload_id})
        return
    source = quarantine_key(upload.account_id, upload.id)
    if upload.status is not UploadStatus.PROCESSING:
        await q.storage.delete(source)  # decided by an earlier delivery, which may have died before this
        return
    raw = await _quarantined(q, upload, source)
    if raw is None:
        return
    log.info("decoding upload", extra={"upload_id": upload.id, "account_id": upload.account_id,
                                       "bytes": len(raw), "attempt": delivery.attempt})
    try:
        async with q.slots:
            clean = await asyncio.to_thread(imagedecode.clean, raw, q.rt.settings.upload_limits())
    except ImageRefused as refused:
        await _reject(q, upload, refused.reason.value, refused.message)
        return
    # Read back and compared before it is marked ready; a store that keeps mangling it raises, and the message
    # is delivered again.
    await integrity.put_verified(q.storage, upload.key, clean.data, clean.kind.content_type, sha256=clean.sha256,
                                 attempts=q.rt.settings.store_verify_attempts)
    marked = await _mark_ready(q, upload.id, Cleaned(bytes=len(clean.data), sha256=clean.sha256,
                                                     width=clean.width, height=clean.height))
    if marked:
        media_metrics.UPLOADS.labels("ready", "").inc()
        log.info("upload ready", extra={"upload_id": upload.id, "account_id": upload.account_id,
                                        "bytes": len(clean.data), "width": clean.width, "height": clean.height})
    else:
        await _discard_if_unwanted(q, upload)
    await q.storage.delete(source)


async def _quarantined(q: Quarantine, upload: UploadRow, source: str) -> bytes | None:
    """The raw bytes, read only once their size is known to be within the upload limit; None (the upload
    rejected) when they are gone or too large."""
    limit = q.rt.settings.upload_max_bytes
    try:
        info = await q.storage.head(source)
        if info.bytes <= limit:
            return await q.storage.get_bytes(source)
    except ObjectNotFound:
        await _reject(q, upload, REASON_UNPROCESSED,
                      "the uploaded bytes were lost before they could be decoded; upload the image again")
        return None
    await _reject(q, upload, Refusal.TOO_LARGE.value, f"the image is larger than {limit} bytes")
    return None


class Cleaned(msgspec.Struct, kw_only=True, frozen=True):
    """What the media worker stored under an upload's key."""

    bytes: int
    sha256: str
    width: int
    height: int


async def _mark_ready(q: Quarantine, upload_id: str, cleaned: Cleaned) -> bool:
    """The processing upload is ready, described by its cleaned image; False when it was not processing (a
    duplicate delivery finished it already, or it was deleted). Through the gateway's function: the table is
    its own."""
    return bool(await q.rt.pool.fetchval("SELECT mark_upload_ready($1, $2, $3, $4, $5)", upload_id, cleaned.bytes,
                                         cleaned.sha256, cleaned.width, cleaned.height))


async def _reject(q: Quarantine, upload: UploadRow, reason: str, message: str) -> None:
    """The processing upload is rejected (through the gateway's function), and its raw bytes removed."""
    if await q.rt.pool.fetchval("SELECT mark_upload_rejected($1, $2, $3)", upload.id, reason, message):
        media_metrics.UPLOADS.labels("rejected", reason).inc()
        log.info("upload rejected", extra={"upload_id": upload.id, "account_id": upload.account_id,
                                           "reason": reason, "error": message})
    await q.storage.delete(quarantine_key(upload.account_id, upload.id))


async def _discard_if_unwanted(q: Quarantine, upload: UploadRow) -> None:
    """The upload stopped processing while it was decoded: kept if another delivery made it ready (with this
    very image), removed if it was deleted or rejected meanwhile."""
    current = await uploads.fetch(q.rt.pool, upload.id)
    if current is None or current.status is not UploadStatus.READY:
        await q.storage.delete(upload.key)
        log.info("upload moved on while it was decoded; its image removed", extra={"upload_id": upload.id})


async def on_dead(q: Quarantine, event: Event) -> None:
    """Its handlings kept failing: the upload is rejected rather than left processing."""
    if not isinstance(event, UploadReceived):
        return
    upload = await uploads.fetch(q.rt.pool, event.upload_id)
    if upload is not None:
        await _reject(q, upload, REASON_UNPROCESSED,
                      "the image could not be processed on our side; upload it again, or another image")
