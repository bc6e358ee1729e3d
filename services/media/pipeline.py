"""One copy of a finished render: download to a temp dir, verify and thumbnail off the event loop, upload.

Nothing here touches the job row; the worker decides what the result means. Uploads overwrite, so a copy
that is redone after a crash simply replaces what an earlier attempt left behind.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec

from libs.common.errors import MediaError
from libs.common.jobs import JobRow, Outputs
from libs.storage.base import Storage, StorageError, job_prefix
from services.media import telemetry
from services.media.assets import StoredAsset
from services.media.download import Fetched, check_url, fetch_to_file
from services.media.thumbnail import Thumbnail, write_thumbnail
from services.media.verify import VideoInfo, inspect_video

VIDEO_NAME = "video.mp4"
THUMBNAIL_NAME = "thumbnail.jpg"


class Stored(msgspec.Struct, frozen=True):
    outputs: Outputs
    assets: list[StoredAsset]


def inspect_and_thumbnail(video: Path, thumb_dest: Path) -> tuple[VideoInfo, Thumbnail]:
    """Verify the video and make its thumbnail from the same decode pass. Blocking."""
    inspection = inspect_video(video)
    return inspection.info, write_thumbnail(inspection.poster, thumb_dest)


@dataclass(frozen=True)
class Copier:
    session: aiohttp.ClientSession
    storage: Storage
    # Decoding is CPU work: it gets its own, smaller limit than downloads, which mostly wait on the network.
    decode_slots: asyncio.Semaphore
    max_bytes: int

    async def copy(self, job: JobRow, *, headers: Mapping[str, str], timeout_s: float) -> Stored:
        """Raises MediaError (download_failed / verification_failed) or StorageError."""
        url = check_url(job.provider_output)
        with tempfile.TemporaryDirectory(prefix="vidjobs-media-") as tmp:
            work = Path(tmp)
            fetched = await fetch_to_file(self.session, url, work / VIDEO_NAME, headers=headers,
                                          max_bytes=self.max_bytes, timeout_s=timeout_s)
            info, thumb = await self.inspect(fetched.path, work / THUMBNAIL_NAME)
            return await self._upload(job, fetched, info, thumb)

    async def inspect(self, video: Path, thumb_dest: Path) -> tuple[VideoInfo, Thumbnail]:
        async with self.decode_slots:
            try:
                result = await asyncio.to_thread(inspect_and_thumbnail, video, thumb_dest)
            except MediaError as err:
                telemetry.VERIFICATIONS.labels(err.code.value).inc()
                raise
        telemetry.VERIFICATIONS.labels("ok").inc()
        return result

    async def _upload(self, job: JobRow, fetched: Fetched, info: VideoInfo, thumb: Thumbnail) -> Stored:
        prefix = job_prefix(job.account_id, job.id)
        video = StoredAsset(kind="video", key=prefix + VIDEO_NAME, content_type="video/mp4", bytes=fetched.bytes,
                            sha256=fetched.sha256, width=info.width, height=info.height, duration_s=info.duration_s)
        poster = StoredAsset(kind="thumbnail", key=prefix + THUMBNAIL_NAME, content_type="image/jpeg",
                             bytes=thumb.bytes, sha256=thumb.sha256, width=thumb.width, height=thumb.height)
        await self._put(video, fetched.path)
        await self._put(poster, thumb.path)
        outputs = Outputs(video_key=video.key, thumbnail_key=poster.key, duration_s=info.duration_s,
                          width=info.width, height=info.height, bytes=fetched.bytes, sha256=fetched.sha256)
        return Stored(outputs=outputs, assets=[video, poster])

    async def _put(self, asset: StoredAsset, path: Path) -> None:
        stored = await self.storage.put_file(asset.key, path, asset.content_type)
        if stored.bytes != asset.bytes:
            raise StorageError(f"stored {stored.bytes} bytes of {asset.bytes} for {asset.key}")
