"""The media worker: copies a finished render from its provider into our storage, verifies it, makes its
thumbnail and preview and completes the job; decodes and cleans uploaded images (quarantine); removes the
objects of deleted and expired jobs; copies a stored original to its owner's bucket when asked (exporting);
and sweeps storage for orphans.

Downloading is its own stage with its own retries: a failed download is tried again (JetStream redelivers
the request with backoff) until its delivery budget or the stage deadline runs out, and never causes a
re-render. A file that is not a video fails the job at once: fetching it again would fetch the same file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

import aiohttp

from vidjobs.common import backoff, bus, events, jobs, logs, netguard, tracing
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode, GiveUp, JobError, MediaError, Redeliver
from vidjobs.common.events import AssetsDeleteRequested, DownloadRequested
from vidjobs.common.jobs import JobRow
from vidjobs.common.renders import Outputs
from vidjobs.common.runtime import Runtime, consumer
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.media import (
    assets,
    copies,
    download,
    exporting,
    media_metrics,
    orphans,
    quarantine,
    readiness,
    scratch,
    stage_deadline,
)
from vidjobs.media.isolation import DecodeGate
from vidjobs.media.pipeline import Copier, PreviewSpec
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.registry import adapter_for, build_adapters
from vidjobs.storage.base import Storage, job_prefix
from vidjobs.storage.factory import open_storage

log = logging.getLogger("vidjobs.media")

MIN_ATTEMPT_S = 1.0  # even a late attempt gets this long to fetch
DECODER_CRASHES = 2  # copies of one render that died while decoding it before it is given up
# Per-request time caps are set by each download; this only bounds connecting and silent peers.
SESSION_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)


@dataclass
class Media:
    rt: Runtime
    storage: Storage
    copier: Copier
    adapters: dict[str, ProviderAdapter]
    exports: aiohttp.ClientSession  # PUTs to the URLs owners name for their exports (guarded, like downloads)
    gate: DecodeGate = field(default_factory=DecodeGate)  # suspects decode alone


async def main(rt: Runtime) -> None:
    scratch.remove_stale()
    async with opened(rt) as media:
        await serve(media)


@contextlib.asynccontextmanager
async def opened(rt: Runtime) -> AsyncIterator[Media]:
    """The service's parts (storage, HTTP sessions, transcoder threads), closed when the block exits."""
    storage = open_storage(rt.settings)
    rt.checks.append(partial(readiness.storage_problem, storage))
    transcoder = ThreadPoolExecutor(max_workers=rt.settings.media_concurrency, thread_name_prefix="transcode")
    try:
        # Adapters talk to configured API base URLs; render URLs come from providers' answers and go through
        # a session of their own that refuses anything but public addresses (and the allowed hosts).
        async with (aiohttp.ClientSession(timeout=SESSION_TIMEOUT, trace_configs=tracing.client_trace_configs())
                    as session,
                    netguard.guarded_session(rt.settings.allowed_download_hosts(), timeout=SESSION_TIMEOUT) as fetch,
                    netguard.guarded_session(rt.settings.allowed_export_hosts(), timeout=SESSION_TIMEOUT,
                                             purpose=netguard.EXPORTS) as send):
            copier = Copier(session=fetch, storage=storage, max_bytes=rt.settings.max_download_bytes,
                            transcoder=transcoder, preview=preview_spec(rt.settings),
                            store_attempts=rt.settings.store_verify_attempts)
            yield Media(rt=rt, storage=storage, copier=copier, adapters=build_adapters(rt.settings, session),
                        exports=send)
    finally:
        transcoder.shutdown(wait=True, cancel_futures=True)
        await storage.close()


def preview_spec(settings: Settings) -> PreviewSpec:
    return PreviewSpec(seconds=settings.preview_seconds, max_side=settings.preview_max_side)


async def serve(media: Media) -> None:
    """Run the consumers and the orphan sweep until the runtime's stop event is set."""
    settings = media.rt.settings
    # A download that keeps failing is failed by its handler after `download_attempts`; a render whose
    # decoding keeps killing the process is given up after DECODER_CRASHES, without blaming the copies that
    # died beside it (they spend one of their `max_deliveries` tries each time).
    downloads = consumer(media.rt, "media-download", events.DOWNLOAD, partial(on_download, media),
                         concurrency=settings.download_concurrency)
    deletes = consumer(media.rt, "media-assets-delete", events.ASSETS_DELETE, partial(on_assets_delete, media),
                       concurrency=4)
    # A dead export settles its row as failed; it never fails its (completed) job.
    exports = consumer(media.rt, "media-export", events.EXPORT,
                       partial(exporting.on_export, media.rt, media.exports, media.storage),
                       concurrency=settings.download_concurrency, on_dead=partial(exporting.on_dead, media.rt))
    # Uploaded images: a few decode at once (Quarantine.slots); a few more wait their turn holding a message.
    received = quarantine.Quarantine.of(media.rt, media.storage)
    images = consumer(media.rt, "media-uploads", events.UPLOADS, partial(quarantine.on_upload_received, received),
                      concurrency=max(1, settings.upload_decode_slots) * 2,
                      on_dead=partial(quarantine.on_dead, received))
    async with asyncio.TaskGroup() as tg:
        tg.create_task(bus.consume(media.rt.js, downloads, media.rt.stop), name="download-consumer")
        tg.create_task(bus.consume(media.rt.js, deletes, media.rt.stop), name="assets-delete-consumer")
        tg.create_task(bus.consume(media.rt.js, exports, media.rt.stop), name="export-consumer")
        tg.create_task(bus.consume(media.rt.js, images, media.rt.stop), name="uploads-consumer")
        tg.create_task(orphans.run(media.rt, media.storage), name="orphan-sweep")


async def on_download(media: Media, event: DownloadRequested, delivery: Delivery) -> None:
    job = await jobs.fetch(media.rt.pool, event.job_id)
    if job is None or job.finished or job.status is not JobStatus.DOWNLOADING:
        log.info("nothing to download", extra={"job_id": event.job_id, "status": job and job.status.value})
        return
    logs.about_job(job.id, job.account_id)
    lease_s = media.rt.settings.media_copy_lease_s
    try:
        crashes = await copies.take(media.rt.pool, job.id, lease_s)
    except copies.Busy as busy:
        # A recovery re-sent the request while some media process is still copying: let that copy finish
        # first. A deferral, not a failure: it spends none of the download's tries.
        raise Redeliver("already copying this job", delay=min(busy.seconds, 5.0)) from busy
    if crashes >= DECODER_CRASHES:
        # The lease is kept until it runs out: by then the dead letter has failed the job. Released now, it
        # would let a duplicate delivery start a copy with the crash count gone, and die decoding once more.
        log.error("decoding this render killed its media process; giving up on it",
                  extra={"job_id": job.id, "crashes": crashes})
        raise GiveUp(f"decoding the render killed the media process {crashes} times")
    async with copies.held(media.rt.pool, job.id, lease_s):
        await _copy(media, job, delivery, suspect=crashes > 0)


async def _copy(media: Media, job: JobRow, delivery: Delivery, *, suspect: bool) -> None:
    deadline = download_deadline(job, media.rt.settings)
    headers = adapter_for(media.adapters, job.provider).download_headers()
    log.info("copying render", extra={"job_id": job.id, "attempt": delivery.attempt})
    download.PACE.set(download_pace(media, job.id))  # this task's download: its handler runs in a task of its own
    try:
        stored = await media.copier.copy(job, headers=headers, timeout_s=_seconds_left(deadline, MIN_ATTEMPT_S),
                                         decoding=partial(_decoding, media, job.id, suspect))
    except MediaError as err:
        await _copy_failed(media, job, err, delivery, deadline)
        return
    await _complete(media, job, stored)


@contextlib.asynccontextmanager
async def _decoding(media: Media, job_id: str, suspect: bool) -> AsyncIterator[None]:
    if suspect:
        log.warning("a process died while decoding this render before; decoding it alone", extra={"job_id": job_id})
    async with media.gate.enter(suspect=suspect), copies.decoding(media.rt.pool, job_id):
        yield


def download_pace(media: Media, job_id: str) -> download.Pace:
    settings = media.rt.settings

    async def extend(seconds: float) -> None:
        log.info("a large render: the download deadline moves with it", extra={"job_id": job_id,
                                                                                "seconds": round(seconds)})
        await stage_deadline.extend(media.rt.pool, job_id, seconds)

    return download.Pace(stall_s=settings.download_stall_s, min_bytes_per_s=settings.download_min_kb_per_s * 1000,
                         extend=extend)


def download_deadline(job: JobRow, settings: Settings) -> datetime:
    """When the download stage gives up: the job's stage deadline, else a fixed time after it entered it."""
    return job.deadline_at or job.updated_at + timedelta(seconds=settings.download_deadline_s)


def may_retry(err: MediaError, attempt: int, budget: int, deadline: datetime, now: datetime) -> bool:
    return err.code is ErrorCode.DOWNLOAD_FAILED and not err.final and attempt < budget and now < deadline


def _seconds_left(deadline: datetime, floor: float = 0.0) -> float:
    return max(floor, (deadline - datetime.now(UTC)).total_seconds())


async def _copy_failed(media: Media, job: JobRow, err: MediaError, delivery: Delivery, deadline: datetime) -> None:
    extra = {"job_id": job.id, "code": err.code.value, "attempt": delivery.attempt, "error": err.message}
    if may_retry(err, delivery.attempt, media.rt.settings.download_attempts, deadline, datetime.now(UTC)):
        media_metrics.COPIES.labels("retry", err.code.value).inc()
        log.warning("download failed; it will be retried", extra=extra)
        settings = media.rt.settings
        delay = backoff.delay(delivery.attempt, base=settings.retry_base_s, cap=settings.retry_cap_s)
        raise Redeliver(err.message, delay=min(delay, _seconds_left(deadline)), counts=True)
    log.error("copy failed; failing the job", extra=extra)
    await _fail(media, job, err)


def job_error(err: MediaError) -> JobError:
    """What the owner sees. A refused address is not worth retrying: the provider will name it again."""
    if err.final:
        return JobError(code=err.code, message=err.message, retryable=False)
    if err.code is ErrorCode.DOWNLOAD_FAILED:
        return JobError.of(err.code, f"{err.message} We stopped retrying the download; run the job again to "
                                     "render it anew.")
    return JobError.of(err.code, err.message)


async def _fail(media: Media, job: JobRow, err: MediaError) -> None:
    error = job_error(err)
    async with media.rt.tx() as conn:
        done = await transition(conn, job.id, JobStatus.FAILED, reason=f"media: {err.code.value}",
                                expect=[JobStatus.DOWNLOADING], update=JobUpdate(error=error, progress=None))
    if done is not None:
        # Counted once the fail has committed, by the one delivery that made it (as the completed count is).
        media_metrics.COPIES.labels("failed", err.code.value).inc()
        # An earlier attempt may have uploaded before it crashed; a failed job keeps no objects.
        await media.storage.delete_prefix(job_prefix(job.account_id, job.id))


async def _complete(media: Media, job: JobRow, stored: Outputs) -> None:
    # The status and the asset rows (the one record of the files) commit together: a completed job always has
    # its rows, and a job that moved on meanwhile (canceled, deleted) gets none.
    async with media.rt.tx() as conn:
        done = await transition(
            conn, job.id, JobStatus.COMPLETED, reason="render stored, verified and thumbnailed",
            expect=[JobStatus.DOWNLOADING], update=JobUpdate(progress=None),
        )
        if done is not None:
            await assets.upsert(conn, job.id, job.account_id, stored)
    if done is None:
        await _discard_if_orphaned(media, job)
        return
    media_metrics.COPIES.labels("completed", "").inc()
    log.info("render stored", extra={"job_id": job.id, "bytes": stored.video.bytes,
                                     "sha256": stored.video.sha256})


async def _discard_if_orphaned(media: Media, job: JobRow) -> None:
    current = await jobs.fetch(media.rt.pool, job.id)
    if current is not None and current.deleted_at is None and current.status is JobStatus.COMPLETED:
        return  # another delivery completed it, with these very objects
    removed = await media.storage.delete_prefix(job_prefix(job.account_id, job.id))
    log.info("job moved on while its render was copied; objects removed",
             extra={"job_id": job.id, "objects": removed})


# What retention removes from an expired job; its thumbnail stays while the job exists.
EXPIRING_KINDS = ("video", "preview")


async def on_assets_delete(media: Media, event: AssetsDeleteRequested, delivery: Delivery) -> None:
    job = await jobs.fetch(media.rt.pool, event.job_id)
    if job is None:
        return  # the row is gone, and its asset rows with it (ON DELETE CASCADE)
    if job.deleted_at is not None:
        removed = await media.storage.delete_prefix(job_prefix(job.account_id, job.id))
        marked = await assets.set_deleted_at(media.rt.pool, job.id)
    elif job.status is JobStatus.EXPIRED:
        removed = await _remove_originals(media, job)
        marked = await assets.set_deleted_at(media.rt.pool, job.id, EXPIRING_KINDS)
    else:
        log.warning("asset deletion asked for a live job; ignored", extra={"job_id": job.id})
        return
    media_metrics.OBJECTS_DELETED.inc(removed)
    log.info("job assets removed", extra={"job_id": job.id, "objects": removed, "rows": marked,
                                          "status": job.status.value, "deleted": job.deleted_at is not None})


async def _remove_originals(media: Media, job: JobRow) -> int:
    keys = await assets.live_keys(media.rt.pool, job.id, EXPIRING_KINDS)
    for key in keys:
        await media.storage.delete(key)
    return len(keys)
