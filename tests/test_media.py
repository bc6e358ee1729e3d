"""The media worker against real parts: PostgreSQL, a nats-server, the filesystem storage and an HTTP server
on loopback that plays the provider, serving a real MP4 rendered here."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import secrets
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import av
import pytest
from aiohttp import web
from PIL import Image

from tests.corrupting import CorruptingStorage
from tests.s3server import TEST_BUCKET
from tests.support import wait_until
from vidjobs.common import bus, creation, deletion, jobs, outbox, renders
from vidjobs.common.errors import ErrorCode, MediaError
from vidjobs.common.events import DownloadRequested
from vidjobs.common.jobs import JobRequest, JobRow
from vidjobs.common.runtime import Runtime, open_runtime
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.media import worker as media_worker
from vidjobs.media.download import fetch_to_file
from vidjobs.media.thumbnail import write_thumbnail
from vidjobs.media.verify import inspect_video
from vidjobs.media.worker import main
from vidjobs.storage.base import ObjectNotFound, Storage, job_prefix
from vidjobs.storage.factory import open_storage
from vidjobs.storage.filesystem import FileStorage

WIDTH, HEIGHT, FPS, FRAMES = 160, 90, 12, 12  # a one-second clip


def render_clip(width: int = WIDTH, height: int = HEIGHT, frames: int = FRAMES) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for i in range(frames):
            image = Image.new("RGB", (width, height), (20 * i % 256, 80, 160))
            container.mux(stream.encode(av.VideoFrame.from_image(image)))
        container.mux(stream.encode())
    return buf.getvalue()


def render_audio_only() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("aac", rate=48000)
        for i in range(10):
            frame = av.AudioFrame(format="fltp", layout="mono", samples=1024)
            frame.planes[0].update(bytes(frame.planes[0].buffer_size))  # silence
            frame.sample_rate, frame.pts = 48000, i * 1024
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buf.getvalue()


def jpeg_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(buf, "JPEG")
    return buf.getvalue()


NOISE = b"<html>this is not a video</html>\n" * 64


@pytest.fixture(scope="session")
def clip() -> bytes:
    return render_clip()


# --- the provider's file server -------------------------------------------------------------------------


def _serving(body: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="video/mp4")

    return handler


class Origin:
    """Serves what a provider might serve at an output URL, and counts the requests per path."""

    def __init__(self, clip: bytes):
        self.clip = clip
        self.hits: Counter[str] = Counter()
        self.base = ""

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count])
        app.router.add_get("/clip.mp4", _serving(self.clip))
        app.router.add_get("/noise.mp4", _serving(NOISE))
        app.router.add_get("/flaky.mp4", self._flaky)
        app.router.add_get("/declared-huge.mp4", _serving(bytes(2 << 20)))
        app.router.add_get("/chunked-huge.mp4", self._chunked_huge)
        app.router.add_get("/slow.mp4", self._slow)
        return app  # anything else, /missing.mp4 included, answers 404

    @web.middleware
    async def _count(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        self.hits[request.path] += 1
        return await handler(request)

    async def _flaky(self, request: web.Request) -> web.Response:
        if self.hits[request.path] == 1:
            return web.Response(status=503, text="busy")
        return web.Response(body=self.clip, content_type="video/mp4")

    async def _chunked_huge(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # no Content-Length: only counting while reading can stop it
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                await resp.write(bytes(64 << 10))
        return resp

    async def _slow(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(1 << 20), "Content-Type": "video/mp4"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(40):  # bounded, so the server can always shut down
                await resp.write(bytes(1024))
                await asyncio.sleep(0.1)
        return resp


@pytest.fixture
async def origin(clip: bytes) -> AsyncIterator[Origin]:
    server = Origin(clip)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.base = f"http://127.0.0.1:{port}"
    yield server
    await runner.cleanup()


# --- verification and thumbnails -------------------------------------------------------------------------


def test_inspect_reads_a_real_clip(clip: bytes, tmp_path: Path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(clip)
    inspection = inspect_video(path)
    assert (inspection.info.width, inspection.info.height) == (WIDTH, HEIGHT)
    assert inspection.info.duration_s == pytest.approx(1.0, abs=0.1)
    assert inspection.info.codec == "h264"
    assert inspection.poster.size == (WIDTH, HEIGHT)


@pytest.mark.parametrize("make", [
    pytest.param(lambda clip: NOISE, id="html"),
    pytest.param(lambda clip: b"", id="empty"),
    pytest.param(lambda clip: jpeg_bytes(), id="still-image"),
    pytest.param(lambda clip: clip[: len(clip) // 2], id="truncated"),
    pytest.param(lambda clip: render_audio_only(), id="audio-only"),
])
def test_inspect_refuses_what_is_not_a_video(make: Callable[[bytes], bytes], clip: bytes, tmp_path: Path):
    path = tmp_path / "file.mp4"
    path.write_bytes(make(clip))
    with pytest.raises(MediaError) as caught:
        inspect_video(path)
    assert caught.value.code is ErrorCode.VERIFICATION_FAILED
    assert "not a playable video" in caught.value.message


def test_thumbnail_is_a_small_jpeg_keeping_the_aspect_ratio(tmp_path: Path):
    large = write_thumbnail(Image.new("RGBA", (1280, 720)), tmp_path / "large.jpg")
    small = write_thumbnail(Image.new("RGB", (90, 160)), tmp_path / "small.jpg")
    assert (large.width, large.height) == (320, 180)
    assert (small.width, small.height) == (90, 160)  # never enlarged
    with Image.open(tmp_path / "large.jpg") as image:
        assert image.format == "JPEG" and image.size == (320, 180)
    assert large.sha256 == hashlib.sha256((tmp_path / "large.jpg").read_bytes()).hexdigest()


# --- downloading -----------------------------------------------------------------------------------------


async def test_fetch_streams_to_a_file_measuring_as_it_goes(origin: Origin, clip: bytes, tmp_path: Path):
    async with aiohttp.ClientSession() as session:
        fetched = await fetch_to_file(session, origin.url("/clip.mp4"), tmp_path / "v.mp4", headers={},
                                      max_bytes=1 << 20, timeout_s=10)
    assert fetched.bytes == len(clip)
    assert fetched.sha256 == hashlib.sha256(clip).hexdigest()
    assert (tmp_path / "v.mp4").read_bytes() == clip


@pytest.mark.parametrize(("path", "timeout_s", "says"), [
    ("/missing.mp4", 10, "HTTP 404"),
    ("/flaky.mp4", 10, "HTTP 503"),
    ("/declared-huge.mp4", 10, "larger than"),
    ("/chunked-huge.mp4", 10, "larger than"),
    ("/slow.mp4", 0.5, "took longer"),
])
async def test_fetch_failures_are_download_failures(origin: Origin, tmp_path: Path, path: str, timeout_s: float,
                                                    says: str):
    async with aiohttp.ClientSession() as session:
        with pytest.raises(MediaError) as caught:
            await fetch_to_file(session, origin.url(path), tmp_path / "v.mp4", headers={}, max_bytes=1 << 20,
                                timeout_s=timeout_s)
    assert caught.value.code is ErrorCode.DOWNLOAD_FAILED
    assert says in caught.value.message


async def test_fetch_from_a_closed_port_is_a_download_failure(tmp_path: Path):
    async with aiohttp.ClientSession() as session:
        with pytest.raises(MediaError) as caught:
            await fetch_to_file(session, "http://127.0.0.1:9/clip.mp4", tmp_path / "v.mp4", headers={},
                                max_bytes=1 << 20, timeout_s=5)
    assert caught.value.code is ErrorCode.DOWNLOAD_FAILED


# --- the worker ------------------------------------------------------------------------------------------


@pytest.fixture
def work_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker's temp dir, so a test can see that it leaves nothing behind."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


@pytest.fixture
def settings(database_url: str, nats_url: str, tmp_path: Path, work_tmp: Path) -> Settings:
    return Settings().with_(
        data_dir=str(tmp_path), database_url=database_url, nats_url=nats_url,
        storage_url=f"file://{tmp_path / 'objects'}", signing_secret="x", retry_base_s=0.1, retry_cap_s=0.5,
        download_allow_hosts="127.0.0.1",  # the origin plays the provider on loopback, on a port of its own
        fake_provider="on",
    )


@contextlib.asynccontextmanager
async def running_media(settings: Settings) -> AsyncIterator[Runtime]:
    async with open_runtime("media", settings) as rt:
        worker = asyncio.create_task(main(rt), name="media-under-test")
        try:
            yield rt
        finally:
            rt.stop.set()
            await asyncio.wait_for(worker, 15)


async def downloading_job(rt: Runtime, output_url: str, *, request_download: bool = True) -> str:
    """A job the provider has just finished, with its DownloadRequested in the outbox."""
    await rt.pool.execute(
        "INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_media', 'media', 1000) ON CONFLICT DO NOTHING")
    async with rt.tx() as conn:
        job = await creation.create(conn, account_id="acct_media", estimated_credits=10, recovery_delay_s=600,
                                    request=JobRequest(model="fake/default", prompt="a fox in snow", duration_s=1))
        await transition(conn, job.id, JobStatus.SUBMITTED, reason="test: accepted",
                         update=JobUpdate(provider_job_id=f"p-{job.id}"))
        await transition(conn, job.id, JobStatus.DOWNLOADING, reason="test: render finished",
                         update=JobUpdate(provider_output=output_url),
                         emit=[DownloadRequested(job_id=job.id)] if request_download else [])
    return job.id


async def wait_status(rt: Runtime, job_id: str, status: JobStatus, within: float = 20) -> JobRow:
    async def reached() -> JobRow | None:
        job = await jobs.fetch(rt.pool, job_id)
        return job if job is not None and job.status is status else None

    return await wait_until(reached, within=within, what=f"{job_id} to be {status}")


async def wait_downloads_idle(rt: Runtime) -> None:
    """Every DownloadRequested staged so far has been published and acked."""
    async def idle() -> bool:
        if await rt.pool.fetchval("SELECT count(*) FROM outbox WHERE subject = 'vidjobs.work.download'"):
            return False
        info = await rt.js.consumer_info(bus.WORK_STREAM, "media-download")
        return info.num_pending == 0 and info.num_ack_pending == 0

    await wait_until(idle, what="the download consumer to go idle")


async def moves(rt: Runtime, job_id: str) -> list[tuple[str | None, str]]:
    rows = await rt.pool.fetch("SELECT from_status, to_status FROM job_transitions WHERE job_id = $1 ORDER BY id",
                               job_id)
    return [(r["from_status"], r["to_status"]) for r in rows]


async def test_a_finished_render_is_stored_verified_and_completed_once(
    settings: Settings, origin: Origin, clip: bytes, work_tmp: Path,
):
    async with running_media(settings) as rt:
        job_id = await downloading_job(rt, origin.url("/clip.mp4"))
        job = await wait_status(rt, job_id, JobStatus.COMPLETED)

        storage = open_storage(settings)
        out = await renders.read(rt.pool, job_id)
        video, poster, clip_file = out.video, out.thumbnail, out.preview
        prefix = job_prefix(job.account_id, job_id)
        assert (video.key, poster.key) == (prefix + "video.mp4", prefix + "thumbnail.jpg")
        assert await storage.get_bytes(video.key) == clip
        assert (video.bytes, video.sha256) == (len(clip), hashlib.sha256(clip).hexdigest())
        assert (video.width, video.height) == (WIDTH, HEIGHT)
        assert video.duration_s == pytest.approx(1.0, abs=0.1)
        with Image.open(io.BytesIO(await storage.get_bytes(poster.key))) as thumb:
            assert thumb.format == "JPEG" and thumb.size == (WIDTH, HEIGHT)
        assert (await moves(rt, job_id))[-1] == ("downloading", "completed")
        rows = await rt.pool.fetch("SELECT kind, key, bytes, sha256 FROM assets WHERE job_id = $1 ORDER BY kind",
                                   job_id)
        assert [(r["kind"], r["key"]) for r in rows] == [
            ("preview", prefix + "preview.mp4"), ("thumbnail", poster.key), ("video", video.key),
        ]
        assert (rows[2]["bytes"], rows[2]["sha256"]) == (video.bytes, video.sha256)
        # The preview is itself a verified, small H.264 clip, and the outputs say its size.
        assert clip_file.key == prefix + "preview.mp4"
        preview = work_tmp.parent / "preview-check.mp4"  # beside, not in, the media temp dir checked below
        preview.write_bytes(await storage.get_bytes(clip_file.key))
        assert hashlib.sha256(preview.read_bytes()).hexdigest() == clip_file.sha256
        info = inspect_video(preview).info
        assert (info.codec, info.width, info.height) == ("h264", clip_file.width, clip_file.height)
        assert max(info.width, info.height) <= settings.preview_max_side
        assert info.duration_s == pytest.approx(clip_file.duration_s, abs=0.1)
        assert (poster.width, poster.height) == (WIDTH, HEIGHT)

        # The same request delivered again finds the job completed and touches nothing.
        assert isinstance(storage, FileStorage)
        stamp = storage.path_for(video.key).stat().st_mtime_ns
        async with rt.tx() as conn:
            await outbox.add(conn, [DownloadRequested(job_id=job_id)])
        await wait_downloads_idle(rt)
        assert origin.hits["/clip.mp4"] == 1
        assert storage.path_for(video.key).stat().st_mtime_ns == stamp
        assert (await moves(rt, job_id)).count(("downloading", "completed")) == 1
    assert not any(work_tmp.iterdir())


async def test_a_failed_download_is_retried_as_its_own_stage(settings: Settings, origin: Origin):
    async with running_media(settings) as rt:
        job_id = await downloading_job(rt, origin.url("/flaky.mp4"))
        job = await wait_status(rt, job_id, JobStatus.COMPLETED)
        trail = await moves(rt, job_id)
    assert origin.hits["/flaky.mp4"] == 2  # a 503, then the clip
    assert job.attempt == 1 and job.error is None  # never re-rendered
    assert trail[-2:] == [("submitted", "downloading"), ("downloading", "completed")]


async def test_an_upload_left_by_an_interrupted_attempt_is_redone(settings: Settings, origin: Origin, clip: bytes):
    async with running_media(settings) as rt:
        job_id = await downloading_job(rt, origin.url("/clip.mp4"), request_download=False)
        # An earlier worker uploaded and crashed before its commit: the job is still downloading.
        storage = open_storage(settings)
        await storage.put_bytes(job_prefix("acct_media", job_id) + "video.mp4", b"half", "video/mp4")
        async with rt.tx() as conn:
            await outbox.add(conn, [DownloadRequested(job_id=job_id)])
        await wait_status(rt, job_id, JobStatus.COMPLETED)
        stored = await renders.read(rt.pool, job_id)
    assert await storage.get_bytes(stored.video.key) == clip


async def test_a_file_that_is_not_a_video_fails_verification(settings: Settings, origin: Origin, work_tmp: Path):
    async with running_media(settings) as rt:
        job_id = await downloading_job(rt, origin.url("/noise.mp4"))
        job = await wait_status(rt, job_id, JobStatus.FAILED)
        assert await rt.pool.fetchval("SELECT count(*) FROM assets WHERE job_id = $1", job_id) == 0
    assert job.error.code is ErrorCode.VERIFICATION_FAILED and job.error.retryable is False
    assert "not a playable video" in job.error.message
    assert origin.hits["/noise.mp4"] == 1  # fetching the same bad file again cannot help
    assert not (Path(settings.storage_url.removeprefix("file://")) / job_prefix("acct_media", job_id)).exists()
    assert not any(work_tmp.iterdir())


async def test_a_missing_output_fails_after_bounded_retries(settings: Settings, origin: Origin, work_tmp: Path):
    async with running_media(settings) as rt:
        job_id = await downloading_job(rt, origin.url("/missing.mp4"))
        job = await wait_status(rt, job_id, JobStatus.FAILED)
        trail = await moves(rt, job_id)
    assert job.error.code is ErrorCode.DOWNLOAD_FAILED
    assert "HTTP 404" in job.error.message
    assert origin.hits["/missing.mp4"] == Settings().download_attempts
    assert trail[-1] == ("downloading", "failed") and trail.count(("downloading", "failed")) == 1
    assert not any(work_tmp.iterdir())


async def test_a_trickling_download_is_given_up_when_its_size_at_the_minimum_rate_runs_out(
        settings: Settings, origin: Origin):
    # /slow.mp4 declares 1 MiB and sends 10 kB/s for 4 s. At 400 kB/s that size may take 2.6 s: longer than
    # the 1 s stage deadline, which moves with it, and shorter than the trickle, which is cut off then.
    async with running_media(settings.with_(download_deadline_s=1.0, download_min_kb_per_s=400)) as rt:
        job_id = await downloading_job(rt, origin.url("/slow.mp4"))
        job = await wait_status(rt, job_id, JobStatus.FAILED, within=10)
    assert job.error.code is ErrorCode.DOWNLOAD_FAILED
    assert "took longer than 3 s" in job.error.message  # the size's allowance (2.6 s), not the stage's 1 s
    assert origin.hits["/slow.mp4"] == 1  # the moved deadline had passed with it: no second try


async def test_deleting_a_job_removes_its_objects(settings: Settings, origin: Origin):
    async with running_media(settings) as rt:
        job_id = await downloading_job(rt, origin.url("/clip.mp4"))
        job = await wait_status(rt, job_id, JobStatus.COMPLETED)
        stored = await renders.read(rt.pool, job_id)
        async with rt.tx() as conn:
            assert await deletion.soft_delete(conn, job_id, job.account_id)

        async def all_marked() -> bool:
            return not await rt.pool.fetchval(
                "SELECT count(*) FROM assets WHERE job_id = $1 AND deleted_at IS NULL", job_id)

        await wait_until(all_marked, what="the asset rows to be marked deleted")
    storage = open_storage(settings)
    for key in (stored.video.key, stored.thumbnail.key):
        with pytest.raises(ObjectNotFound):
            await storage.head(key)


# --- what lands in storage is checked against what was downloaded -------------------------------------------


@pytest.fixture(params=["file", "s3"])
def any_backend(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "file":
        return settings
    request.getfixturevalue("s3_server")
    return settings.with_(storage_url=f"s3://{TEST_BUCKET}/media-{secrets.token_hex(4)}")


@contextlib.contextmanager
def corrupting_media_storage(monkeypatch: pytest.MonkeyPatch, *, times: int) -> Iterator[list[CorruptingStorage]]:
    """The media worker's storage, wrapped so that its first `times` stores of each object are corrupted in the
    store right after they land."""
    made: list[CorruptingStorage] = []

    def opened(settings: Settings) -> Storage:
        made.append(CorruptingStorage(open_storage(settings), times=times))
        return made[-1]

    monkeypatch.setattr(media_worker, "open_storage", opened)
    yield made


async def test_an_object_corrupted_after_its_store_is_caught_and_stored_again(
    any_backend: Settings, origin: Origin, clip: bytes, monkeypatch: pytest.MonkeyPatch,
):
    with corrupting_media_storage(monkeypatch, times=1) as made:
        async with running_media(any_backend) as rt:
            job_id = await downloading_job(rt, origin.url("/clip.mp4"))
            job = await wait_status(rt, job_id, JobStatus.COMPLETED)
            out = await renders.read(rt.pool, job_id)
    prefix = job_prefix(job.account_id, job_id)
    # Every object was corrupted once, caught, and stored again within the one copy: no second download.
    assert sorted(made[0].corrupted) == [prefix + n for n in ("preview.mp4", "thumbnail.jpg", "video.mp4")]
    assert origin.hits["/clip.mp4"] == 1 and job.error is None
    storage = open_storage(any_backend)
    try:
        assert await storage.get_bytes(out.video.key) == clip
        for file in (out.thumbnail, out.preview):
            data = await storage.get_bytes(file.key)
            assert (len(data), hashlib.sha256(data).hexdigest()) == (file.bytes, file.sha256)
    finally:
        await storage.close()


async def test_a_store_that_never_keeps_the_render_intact_fails_the_job_honestly(
    settings: Settings, origin: Origin, monkeypatch: pytest.MonkeyPatch, work_tmp: Path,
):
    with corrupting_media_storage(monkeypatch, times=1000):
        async with running_media(settings.with_(download_attempts=2, store_verify_attempts=2)) as rt:
            job_id = await downloading_job(rt, origin.url("/clip.mp4"))
            job = await wait_status(rt, job_id, JobStatus.FAILED)
            trail = await moves(rt, job_id)
    assert job.error.code is ErrorCode.DOWNLOAD_FAILED and job.error.retryable
    assert "could not be stored intact" in job.error.message
    assert origin.hits["/clip.mp4"] == 2  # copied again from the download, then given up
    assert trail[-1] == ("downloading", "failed")
    assert not (Path(settings.storage_url.removeprefix("file://")) / job_prefix("acct_media", job_id)).exists()
    assert not any(work_tmp.iterdir())
