"""One copy of a finished render: download to a temp dir; verify, thumbnail and preview off the event loop; upload.

Nothing here touches the job row; the worker decides what the result means. Uploads overwrite, so a copy
that is redone after a crash simply replaces what an earlier attempt left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import av
import av.error
import msgspec

from vidjobs.common.errors import ErrorCode, MediaError
from vidjobs.common.jobs import JobRow
from vidjobs.common.renders import Outputs, StoredFile
from vidjobs.media import media_metrics, scratch
from vidjobs.media.download import Fetched, check_url, fetch_to_file
from vidjobs.media.preview import Preview, PreviewWriter
from vidjobs.media.thumbnail import Thumbnail, write_thumbnail
from vidjobs.media.verify import OPEN_OPTIONS, PosterPicker, TrackReader, VideoInfo, checked_stream, not_video
from vidjobs.storage import integrity
from vidjobs.storage.base import ObjectMismatch, Storage, job_prefix

VIDEO_NAME = "video.mp4"
THUMBNAIL_NAME = "thumbnail.jpg"
PREVIEW_NAME = "preview.mp4"


class Derived(msgspec.Struct, frozen=True):
    info: VideoInfo
    thumbnail: Thumbnail
    preview: Preview


@dataclass(frozen=True)
class PreviewSpec:
    seconds: float = 3.0
    max_side: int = 320


def derive(video: Path, work: Path, spec: PreviewSpec) -> Derived:
    """Verify the video and make its thumbnail and preview, all from one decode pass of its first seconds;
    the rest of the track is read, not decoded, to prove it is all there. Blocking."""
    try:
        with av.open(str(video), container_options=OPEN_OPTIONS, metadata_errors="replace") as container, \
                PreviewWriter(work / PREVIEW_NAME, seconds=spec.seconds, max_side=spec.max_side) as clip:
            stream, duration = checked_stream(container)
            poster = PosterPicker(duration)
            track = TrackReader(container, stream)
            for frame in track.frames(lambda at, lasts: clip.needs(at, lasts) or poster.needs(at, lasts)):
                clip.offer(frame)
                if poster.offer(frame) and not clip.wants(frame.time or 0.0):
                    break
            track.finish()
            inspection = poster.inspection(stream, duration)
            preview = clip.finish()
    except av.error.FFmpegError as exc:
        raise not_video("it cannot be read as an MP4 video") from exc
    if preview is None:
        raise not_video("no frame of it could be decoded for the preview")
    thumb = write_thumbnail(inspection.poster, work / THUMBNAIL_NAME)
    return Derived(info=inspection.info, thumbnail=thumb, preview=preview)


@dataclass(frozen=True)
class Copier:
    session: aiohttp.ClientSession
    storage: Storage
    max_bytes: int
    # Decoding and encoding are CPU work: they run on their own small pool of threads, apart from the default
    # executor that downloads write through, so a burst of transcodes never stalls a download or the loop.
    transcoder: Executor
    preview: PreviewSpec = PreviewSpec()
    store_attempts: int = integrity.DEFAULT_ATTEMPTS  # stores of one object that the store did not keep intact

    async def copy(self, job: JobRow, *, headers: Mapping[str, str], timeout_s: float,
                   decoding: Callable[[], AbstractAsyncContextManager[None]] = contextlib.nullcontext) -> Outputs:
        """Raises MediaError (download_failed / verification_failed) or StorageError. `decoding` wraps the
        decode, the step a hostile render can crash. Every object stored is read back from the store (its size
        and SHA-256) and stored again while it differs; one that never comes back intact is a download_failed,
        which the worker retries from the download on."""
        url = check_url(job.provider_output)
        with tempfile.TemporaryDirectory(prefix=scratch.own_prefix(), dir=scratch.root()) as tmp:
            work = Path(tmp)
            fetched = await fetch_to_file(self.session, url, work / VIDEO_NAME, headers=headers,
                                          max_bytes=self.max_bytes, timeout_s=timeout_s)
            async with decoding():
                derived = await self.derive(fetched.path, work)
            return await self._upload(job, fetched, derived)

    async def derive(self, video: Path, work: Path) -> Derived:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            result = await loop.run_in_executor(self.transcoder, derive, video, work, self.preview)
        except MediaError as err:
            media_metrics.VERIFICATIONS.labels(err.code.value).inc()
            raise
        media_metrics.VERIFICATIONS.labels("ok").inc()
        media_metrics.TRANSCODE_SECONDS.observe(time.perf_counter() - started)
        return result

    async def _upload(self, job: JobRow, fetched: Fetched, derived: Derived) -> Outputs:
        prefix = job_prefix(job.account_id, job.id)
        info, thumb, preview = derived.info, derived.thumbnail, derived.preview
        video = StoredFile(key=prefix + VIDEO_NAME, content_type="video/mp4", bytes=fetched.bytes,
                           sha256=fetched.sha256, width=info.width, height=info.height, duration_s=info.duration_s)
        poster = StoredFile(key=prefix + THUMBNAIL_NAME, content_type="image/jpeg", bytes=thumb.bytes,
                            sha256=thumb.sha256, width=thumb.width, height=thumb.height)
        clip = StoredFile(key=prefix + PREVIEW_NAME, content_type="video/mp4", bytes=preview.bytes,
                          sha256=preview.sha256, width=preview.width, height=preview.height,
                          duration_s=preview.duration_s)
        for file, path in ((video, fetched.path), (poster, thumb.path), (clip, preview.path)):
            await self._put(file, path)
        return Outputs(video=video, thumbnail=poster, preview=clip)

    async def _put(self, file: StoredFile, path: Path) -> None:
        try:
            await integrity.put_verified(self.storage, file.key, path, file.content_type, sha256=file.sha256,
                                         attempts=self.store_attempts)
        except ObjectMismatch as exc:
            media_metrics.STORE_MISMATCHES.inc()
            raise MediaError(ErrorCode.DOWNLOAD_FAILED,
                             f"The render could not be stored intact: {exc}. It will be copied again.") from exc
