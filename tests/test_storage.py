"""One suite, both storage backends: the filesystem backend (its signed URLs served by the gateway's files
route on a real port) and the S3 backend against moto's S3 server in a subprocess on loopback."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import hashlib
import os
import secrets
import time
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import aiohttp
import pytest
from aiohttp import web
from botocore.exceptions import ClientError

from tests.corrupting import CorruptingStorage, flipped
from tests.faults.s3front import S3Front
from tests.s3server import TEST_BUCKET, MotoS3
from vidjobs.cli.embedded import free_port
from vidjobs.common import faults
from vidjobs.common.errors import ConfigError
from vidjobs.common.estimates import Estimator
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings
from vidjobs.gateway import routes_files
from vidjobs.gateway.apierrors import error_middleware
from vidjobs.gateway.browsertokens import Tokens
from vidjobs.gateway.feeds import Feeds
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.gateway.platform_accounts import PlatformAccounts
from vidjobs.gateway.platformkeys import PlatformKeys
from vidjobs.gateway.processcaps import StreamSlots
from vidjobs.gateway.ratelimit import Buckets
from vidjobs.gateway.routetable import register
from vidjobs.gateway.state import GATEWAY, Gateway
from vidjobs.storage.base import (
    MalformedAnswer,
    ObjectMismatch,
    ObjectNotFound,
    Storage,
    StorageError,
    StorageUnavailable,
    job_prefix,
)
from vidjobs.storage.factory import open_storage
from vidjobs.storage.filesystem import FileStorage
from vidjobs.storage.integrity import put_verified
from vidjobs.storage.s3 import S3Storage

BUCKET = TEST_BUCKET
PART = 5 * 1024 * 1024  # S3's smallest part, so a modest file already takes several
VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40
PREFIX = job_prefix("acc_1", "job_1")


@dataclass
class Backend:
    name: str
    storage: Storage


@contextlib.asynccontextmanager
async def files_route(root: Path) -> AsyncIterator[FileStorage]:
    """A FileStorage whose signed URLs are served by the gateway's own files route on a free port."""
    port, secret = free_port(), secrets.token_urlsafe(24)
    storage = FileStorage(root, base_url=f"http://127.0.0.1:{port}", secret=secret)
    app = web.Application(middlewares=[error_middleware])
    # The files route reads only the settings and the storage; it needs no database or NATS.
    settings = Settings(signing_secret=secret)
    app[GATEWAY] = Gateway(settings=settings, rt=cast(Runtime, None), storage=storage,
                           adapters={}, streams=StreamSlots(per_account=1, per_key=1), buckets=cast(Buckets, None),
                           platform_keys=cast(PlatformKeys, None), tokens=cast(Tokens, None), credential_rates={},
                           webhook_rates={}, estimator=Estimator(settings), routes=cast(LiveRoutes, None),
                           platform_accounts=cast(PlatformAccounts, None), feeds=cast(Feeds, None))
    register(app, routes_files.ROUTES)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield storage
    finally:
        await runner.cleanup()


@pytest.fixture(params=["file", "s3"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "file":
        async with files_route(tmp_path / "objects") as storage:
            yield Backend("file", storage)
        return
    request.getfixturevalue("s3_server")
    # Each test gets its own key prefix in the shared bucket, so tests never see each other's objects.
    storage = S3Storage(BUCKET, f"suite-{secrets.token_hex(4)}", part_bytes=PART)
    try:
        yield Backend("s3", storage)
    finally:
        await storage.close()


@pytest.fixture
async def s3(s3_server: MotoS3) -> AsyncIterator[S3Storage]:
    storage = S3Storage(BUCKET, f"suite-{secrets.token_hex(4)}", part_bytes=PART)
    yield storage
    await storage.close()


@pytest.fixture
async def fronted(s3_server: MotoS3, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[S3Front, S3Storage]]:
    """An S3Storage that reaches moto through the HTTP front, which a test can make misbehave."""
    async with S3Front(s3_server.endpoint).running() as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.url)  # botocore reads the endpoint from the environment
        storage = S3Storage(BUCKET, f"suite-{secrets.token_hex(4)}", part_bytes=PART)
        try:
            yield front, storage
        finally:
            await storage.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _random_file(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


async def _listed(storage: Storage, prefix: str) -> dict[str, int]:
    return {info.key: info.bytes async for info in storage.list_prefix(prefix)}


async def test_bytes_round_trip(backend: Backend):
    stored = await backend.storage.put_bytes(PREFIX + "note.txt", b"hello", "text/plain")

    assert (stored.key, stored.bytes, stored.content_type) == (PREFIX + "note.txt", 5, "text/plain")
    assert await backend.storage.get_bytes(PREFIX + "note.txt") == b"hello"


async def test_put_file_again_replaces_the_object(backend: Backend, tmp_path: Path):
    first, second = tmp_path / "first.mp4", tmp_path / "second.mp4"
    first.write_bytes(b"a" * 100)
    second.write_bytes(VIDEO)

    await backend.storage.put_file(PREFIX + "video.mp4", first, "video/mp4")
    stored = await backend.storage.put_file(PREFIX + "video.mp4", second, "video/mp4")

    assert stored.bytes == len(VIDEO)
    assert await backend.storage.get_bytes(PREFIX + "video.mp4") == VIDEO
    assert await _listed(backend.storage, PREFIX) == {PREFIX + "video.mp4": len(VIDEO)}


async def test_a_stored_file_outlives_its_source(backend: Backend, tmp_path: Path):
    source = tmp_path / "render.mp4"
    source.write_bytes(VIDEO)
    await backend.storage.put_file(PREFIX + "video.mp4", source, "video/mp4")
    source.unlink()  # the scratch directory goes once the copy is stored

    assert await backend.storage.get_bytes(PREFIX + "video.mp4") == VIDEO


async def test_a_content_type_is_kept_whether_or_not_the_name_implies_it(backend: Backend):
    key = PREFIX + "clip.mp4"
    await backend.storage.put_bytes(key, b"x", "application/x-odd")
    assert (await backend.storage.head(key)).content_type == "application/x-odd"
    await backend.storage.put_bytes(key, b"y", "video/mp4")
    assert (await backend.storage.head(key)).content_type == "video/mp4"
    if isinstance(backend.storage, FileStorage):  # what the name implies is not written down beside it
        assert not backend.storage.path_for(key).with_name("clip.mp4.content-type").exists()


async def test_head_reports_size_content_type_and_time(backend: Backend):
    before = time.time()
    await backend.storage.put_bytes(PREFIX + "thumb.jpg", b"\xff\xd8" * 50, "image/jpeg")

    info = await backend.storage.head(PREFIX + "thumb.jpg")

    assert (info.key, info.bytes, info.content_type) == (PREFIX + "thumb.jpg", 100, "image/jpeg")
    assert info.modified_at is not None and before - 2 <= info.modified_at <= time.time() + 2


async def test_a_missing_object_is_not_found(backend: Backend):
    with pytest.raises(ObjectNotFound):
        await backend.storage.head(PREFIX + "nothing.mp4")
    with pytest.raises(ObjectNotFound):
        await backend.storage.get_bytes(PREFIX + "nothing.mp4")


async def test_delete_removes_and_a_missing_object_is_fine(backend: Backend):
    await backend.storage.put_bytes(PREFIX + "video.mp4", VIDEO, "video/mp4")

    await backend.storage.delete(PREFIX + "video.mp4")
    await backend.storage.delete(PREFIX + "video.mp4")  # again: already gone
    await backend.storage.delete(PREFIX + "never-there.mp4")

    with pytest.raises(ObjectNotFound):
        await backend.storage.head(PREFIX + "video.mp4")


async def test_delete_prefix_removes_only_that_prefix_and_counts(backend: Backend):
    doomed, kept = job_prefix("acc_1", "job_1"), job_prefix("acc_1", "job_10")
    for name in ("video.mp4", "thumb.jpg", "preview/clip.mp4"):
        await backend.storage.put_bytes(doomed + name, b"x", "application/octet-stream")
    await backend.storage.put_bytes(kept + "video.mp4", b"y", "video/mp4")

    removed = await backend.storage.delete_prefix(doomed)

    assert removed == 3
    assert await _listed(backend.storage, "accounts/") == {kept + "video.mp4": 1}
    assert await backend.storage.delete_prefix(doomed) == 0


async def test_list_prefix_gives_sizes_and_times(backend: Backend):
    before = time.time()
    await backend.storage.put_bytes(PREFIX + "video.mp4", VIDEO, "video/mp4")
    await backend.storage.put_bytes(PREFIX + "thumb.jpg", b"j" * 10, "image/jpeg")
    await backend.storage.put_bytes(job_prefix("acc_2", "job_9") + "video.mp4", b"v", "video/mp4")

    listed = [info async for info in backend.storage.list_prefix("accounts/acc_1/")]

    assert sorted((i.key, i.bytes) for i in listed) == [(PREFIX + "thumb.jpg", 10), (PREFIX + "video.mp4", len(VIDEO))]
    assert all(i.modified_at is not None and before - 2 <= i.modified_at <= time.time() + 2 for i in listed)
    assert await _listed(backend.storage, "accounts/acc_3/") == {}


async def test_listing_and_deleting_page_past_a_thousand_objects(backend: Backend):
    keys = [f"{PREFIX}frames/{i:05d}.bin" for i in range(1003)]
    slots = asyncio.Semaphore(16)

    async def put(key: str) -> None:
        async with slots:
            await backend.storage.put_bytes(key, key.encode(), "application/octet-stream")

    await asyncio.gather(*(put(k) for k in keys))

    listed = await _listed(backend.storage, PREFIX)
    assert sorted(listed) == keys and all(size == len(k) for k, size in listed.items())
    assert await backend.storage.delete_prefix(PREFIX) == len(keys)
    assert await _listed(backend.storage, PREFIX) == {}


async def test_a_file_of_several_parts_round_trips(backend: Backend, tmp_path: Path):
    big = tmp_path / "render.mp4"
    digest = _random_file(big, 13 * 1024 * 1024 + 12345)  # two full 5 MiB parts and a short last one

    stored = await backend.storage.put_file(PREFIX + "video.mp4", big, "video/mp4")

    assert stored.bytes == big.stat().st_size
    assert (await backend.storage.head(PREFIX + "video.mp4")).bytes == stored.bytes
    assert hashlib.sha256(await backend.storage.get_bytes(PREFIX + "video.mp4")).hexdigest() == digest


async def test_a_signed_url_reads_the_object_and_its_ranges(backend: Backend, http: aiohttp.ClientSession):
    await backend.storage.put_bytes(PREFIX + "video.mp4", VIDEO, "video/mp4")

    url, expires = backend.storage.signed_url(PREFIX + "video.mp4", 60)

    assert time.time() + 55 < expires <= time.time() + 60
    async with http.get(url) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "video/mp4"
        assert await resp.read() == VIDEO
    # Browsers seek in a video with Range requests.
    async with http.get(url, headers={"Range": "bytes=100-199"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 100-199/{len(VIDEO)}"
        assert await resp.read() == VIDEO[100:200]


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | changes
    return urlunsplit(parts._replace(query=urlencode(query)))


def _tampered(url: str) -> str:
    name = "sig" if "sig=" in url else "X-Amz-Signature"
    sig = parse_qs(urlsplit(url).query)[name][0]
    return _with_query(url, **{name: ("0" if sig[0] != "0" else "1") + sig[1:]})


async def test_a_signed_url_refuses_tampering_expiry_and_other_objects(backend: Backend,
                                                                       http: aiohttp.ClientSession):
    if backend.name == "s3":
        pytest.skip("moto serves presigned URLs without checking signature or expiry; S3 itself refuses them "
                    "(test_s3_presigned_url_covers_one_object_one_method_and_the_ttl checks what we sign)")
    for name in ("video.mp4", "thumb.jpg"):
        await backend.storage.put_bytes(PREFIX + name, VIDEO, "video/mp4")
    url, _ = backend.storage.signed_url(PREFIX + "video.mp4", 60)
    short_lived, expires = backend.storage.signed_url(PREFIX + "video.mp4", 1)
    await asyncio.sleep(expires + 1.1 - time.time())  # past the expiry, by the clock the server checks

    for refused in [
        _tampered(url),
        url.replace("video.mp4", "thumb.jpg"),  # the same signature on another object
        short_lived,  # correctly signed, but expired
    ]:
        async with http.get(refused) as resp:
            assert resp.status == 403, refused
    async with http.get(url) as resp:
        assert resp.status == 200  # the untouched URL still reads


async def test_keys_that_climb_out_are_refused(backend: Backend, tmp_path: Path):
    for key in ("../escape.mp4", "accounts/../../escape.mp4", "/tmp/escape.mp4"):
        with pytest.raises(StorageError):
            await backend.storage.put_bytes(key, b"x", "video/mp4")
        with pytest.raises(StorageError):
            await backend.storage.get_bytes(key)
    assert not (tmp_path / "escape.mp4").exists()


async def test_s3_keys_live_under_the_url_prefix(s3: S3Storage):
    await s3.put_bytes(PREFIX + "video.mp4", VIDEO, "video/mp4")

    client = await s3.client()
    page = await client.list_objects_v2(Bucket=BUCKET, Prefix=s3.prefix)

    assert [item["Key"] for item in page["Contents"]] == [s3.prefix + PREFIX + "video.mp4"]
    assert [i.key async for i in s3.list_prefix(PREFIX)] == [PREFIX + "video.mp4"]


async def test_s3_a_large_file_goes_up_in_parts(s3: S3Storage, tmp_path: Path):
    big = tmp_path / "render.mp4"
    _random_file(big, 13 * 1024 * 1024 + 12345)

    await s3.put_file(PREFIX + "video.mp4", big, "video/mp4")

    client = await s3.client()
    meta = await client.head_object(Bucket=BUCKET, Key=s3.full_key(PREFIX + "video.mp4"))
    assert meta["ETag"].strip('"').endswith("-3")  # S3 marks a multipart object with its part count


async def test_s3_upload_memory_stays_near_one_part(s3: S3Storage, tmp_path: Path):
    big = tmp_path / "render.mp4"
    _random_file(big, 6 * PART + 777)
    await s3.client()  # opening it loads S3's service model (megabytes), which is not the upload's doing

    tracemalloc.start()
    try:
        await s3.put_file(PREFIX + "video.mp4", big, "video/mp4")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 3 * PART, f"peak {peak / 2**20:.1f} MiB for a {big.stat().st_size / 2**20:.1f} MiB file"


async def test_s3_a_failed_upload_is_aborted(s3: S3Storage, tmp_path: Path):
    big = tmp_path / "render.mp4"
    _random_file(big, 3 * PART)
    client = await s3.client()
    parts_sent = 0

    def refuse_second_part(**_: object) -> None:
        nonlocal parts_sent
        parts_sent += 1
        if parts_sent == 2:  # S3 refusing mid-upload, as when credentials are revoked
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "revoked"}}, "UploadPart")

    client.meta.events.register("before-send.s3.UploadPart", refuse_second_part)
    try:
        with pytest.raises(StorageError) as raised:
            await s3.put_file(PREFIX + "video.mp4", big, "video/mp4")
    finally:
        client.meta.events.unregister("before-send.s3.UploadPart", refuse_second_part)

    assert isinstance(raised.value.__cause__, ClientError)
    uploads = await client.list_multipart_uploads(Bucket=BUCKET, Prefix=s3.prefix)
    assert uploads.get("Uploads", []) == []
    with pytest.raises(ObjectNotFound):
        await s3.head(PREFIX + "video.mp4")


async def test_s3_presigned_url_covers_one_object_one_method_and_the_ttl(s3: S3Storage):
    url, expires = s3.signed_url(PREFIX + "video.mp4", 900)

    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    signed_at = calendar.timegm(time.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    assert parts.path == f"/{BUCKET}/{s3.prefix}{PREFIX}video.mp4"  # path style, for a loopback endpoint
    assert query["X-Amz-Expires"] == "900" and query["X-Amz-SignedHeaders"] == "host"
    assert expires <= signed_at + 900 <= expires + 1
    assert s3.signed_url(PREFIX + "thumb.jpg", 900)[0].split("X-Amz-Signature=")[1] != query["X-Amz-Signature"]


async def test_the_factory_opens_either_backend_from_the_url(tmp_path: Path):
    file = open_storage(Settings(storage_url=f"file://{tmp_path / 'objects'}", signing_secret="s"))
    s3 = open_storage(Settings(storage_url="s3://media.example-1/renders/v1/"))
    try:
        assert isinstance(file, FileStorage) and isinstance(file, Storage)
        assert isinstance(s3, S3Storage) and isinstance(s3, Storage)
        assert (s3.bucket, s3.prefix) == ("media.example-1", "renders/v1/")
        assert open_storage(Settings(storage_url="s3://media-bucket")).prefix == ""
    finally:
        await s3.close()


@pytest.mark.parametrize("url", [
    "s3://", "s3:///renders", "s3://Media_Bucket/renders", "s3://ab/renders", "s3://user:pw@media-bucket/x",
    "s3://media-bucket:9000/x", "s3://media-bucket/../x", "s3://media-bucket/x?region=eu", "gs://media-bucket/x",
])
def test_the_factory_refuses_a_malformed_storage_url(url: str):
    with pytest.raises(ConfigError, match="VIDJOBS_STORAGE_URL"):
        open_storage(Settings(storage_url=url))


def test_the_factory_refuses_s3_parts_below_the_s3_minimum():
    with pytest.raises(ConfigError, match="VIDJOBS_S3_PART_BYTES"):
        open_storage(Settings(storage_url="s3://media-bucket/x", s3_part_bytes=1024 * 1024))


# --- every stored object is read back: size and SHA-256 as the store reports them ---------------------------


async def test_the_store_reports_the_size_and_sha256_of_what_it_holds(backend: Backend, tmp_path: Path):
    await backend.storage.put_bytes(PREFIX + "thumb.jpg", VIDEO, "image/jpeg")
    small = tmp_path / "preview.mp4"
    small_sha = _random_file(small, 4096)
    await backend.storage.put_file(PREFIX + "preview.mp4", small, "video/mp4")

    found = await backend.storage.digest(PREFIX + "thumb.jpg")

    assert (found.bytes, found.sha256, found.parts) == (len(VIDEO), hashlib.sha256(VIDEO).hexdigest(), 0)
    assert (await backend.storage.verify(PREFIX + "preview.mp4", small, small_sha)).bytes == 4096
    assert (await backend.storage.verify(PREFIX + "thumb.jpg", VIDEO, hashlib.sha256(VIDEO).hexdigest())).bytes \
        == len(VIDEO)
    with pytest.raises(ObjectNotFound):
        await backend.storage.digest(PREFIX + "never-stored.mp4")


async def test_an_object_that_is_not_what_was_sent_is_a_mismatch(backend: Backend, tmp_path: Path):
    sent = tmp_path / "video.mp4"
    sha = _random_file(sent, 4096)
    await backend.storage.put_file(PREFIX + "video.mp4", sent, "video/mp4")
    await backend.storage.put_bytes(PREFIX + "video.mp4", flipped(sent.read_bytes()), "video/mp4")  # rotted

    with pytest.raises(ObjectMismatch, match="SHA-256"):
        await backend.storage.verify(PREFIX + "video.mp4", sent, sha)
    await backend.storage.put_bytes(PREFIX + "video.mp4", sent.read_bytes()[:-1], "video/mp4")  # cut short
    with pytest.raises(ObjectMismatch, match="4095 bytes"):
        await backend.storage.verify(PREFIX + "video.mp4", sent, sha)
    assert isinstance(ObjectMismatch("x"), StorageUnavailable)  # a fault of the store: retried, never a 500


async def test_a_file_of_several_parts_is_verified_part_by_part(backend: Backend, tmp_path: Path):
    big = tmp_path / "render.mp4"
    sha = _random_file(big, 2 * PART + 12345)
    await backend.storage.put_file(PREFIX + "video.mp4", big, "video/mp4")

    assert (await backend.storage.verify(PREFIX + "video.mp4", big, sha)).bytes == big.stat().st_size

    other = tmp_path / "other.mp4"
    _random_file(other, big.stat().st_size)  # as long, other bytes, also in parts
    await backend.storage.put_file(PREFIX + "video.mp4", other, "video/mp4")
    with pytest.raises(ObjectMismatch):
        await backend.storage.verify(PREFIX + "video.mp4", big, sha)


async def test_s3_verifying_parts_also_proves_the_local_file(s3: S3Storage, tmp_path: Path):
    big = tmp_path / "render.mp4"
    sha = _random_file(big, 2 * PART + 1)
    await s3.put_file(PREFIX + "video.mp4", big, "video/mp4")
    found = await s3.digest(PREFIX + "video.mp4")
    assert found.sha256 != sha  # S3 holds the hash of the parts' hashes, not of the whole

    with pytest.raises(ObjectMismatch, match="local copy"):
        await s3.verify(PREFIX + "video.mp4", big, hashlib.sha256(b"what the download hashed").hexdigest())


async def test_s3_an_object_stored_without_a_checksum_cannot_be_verified(s3: S3Storage):
    client = await s3.client()
    await client.put_object(Bucket=BUCKET, Key=s3.full_key(PREFIX + "video.mp4"), Body=VIDEO)

    with pytest.raises(ObjectMismatch, match="no SHA-256"):
        await s3.verify(PREFIX + "video.mp4", VIDEO, hashlib.sha256(VIDEO).hexdigest())


async def test_s3_a_head_answered_without_the_size_or_time_is_a_malformed_answer(
        fronted: tuple[S3Front, S3Storage]):
    front, s3 = fronted
    key, sha = PREFIX + "video.mp4", hashlib.sha256(VIDEO).hexdigest()
    await put_verified(s3, key, VIDEO, "video/mp4", sha256=sha)

    front.drop_from_heads("Content-Length")  # as an HTTP front before an S3-compatible store once did
    with pytest.raises(MalformedAnswer, match="ContentLength") as raised:
        await s3.head(key)
    # The store misbehaving, like one that answers 5xx: a 503 from the API, a deferral for a worker.
    assert isinstance(raised.value, StorageUnavailable) and faults.is_infrastructure(raised.value)
    with pytest.raises(MalformedAnswer, match="ContentLength"):
        await s3.digest(key)
    with pytest.raises(MalformedAnswer, match="ContentLength"):  # not a mismatch: storing again cannot help
        await put_verified(s3, key, VIDEO, "video/mp4", sha256=sha)

    front.drop_from_heads("Last-Modified")
    with pytest.raises(MalformedAnswer, match="LastModified"):
        await s3.head(key)
    assert (await s3.digest(key)).bytes == len(VIDEO)  # a digest needs no time

    front.mend()
    assert (await s3.head(key)).bytes == len(VIDEO)


async def test_s3_a_listing_without_sizes_or_keys_is_a_malformed_answer(fronted: tuple[S3Front, S3Storage]):
    front, s3 = fronted
    await s3.put_bytes(PREFIX + "a.mp4", VIDEO, "video/mp4")

    front.drop_elements("Size")
    with pytest.raises(MalformedAnswer, match="Size") as raised:
        [info async for info in s3.list_prefix(PREFIX)]
    assert faults.is_infrastructure(raised.value)  # a store answering badly is deferred, like one answering 5xx

    front.drop_elements("Key")
    with pytest.raises(MalformedAnswer, match="Key"):
        await s3.delete_prefix(PREFIX)

    front.mend()  # nothing was deleted while the listing could not be read
    assert [info.bytes async for info in s3.list_prefix(PREFIX)] == [len(VIDEO)]


async def test_s3_a_multipart_upload_started_without_its_id_is_a_malformed_answer(
        fronted: tuple[S3Front, S3Storage], tmp_path: Path):
    front, s3 = fronted
    big = tmp_path / "render.mp4"
    _random_file(big, PART + 1)

    front.drop_elements("UploadId")
    with pytest.raises(MalformedAnswer, match="UploadId") as raised:
        await s3.put_file(PREFIX + "video.mp4", big, "video/mp4")
    assert faults.is_infrastructure(raised.value)

    front.mend()
    with pytest.raises(ObjectNotFound):  # no part of it was sent
        await s3.head(PREFIX + "video.mp4")


async def test_s3_a_part_stored_without_its_etag_aborts_the_upload(fronted: tuple[S3Front, S3Storage], tmp_path: Path):
    front, s3 = fronted
    big = tmp_path / "render.mp4"
    sha = _random_file(big, 2 * PART + 1)

    front.drop_from_answers("ETag")
    with pytest.raises(MalformedAnswer, match="ETag") as raised:
        await s3.put_file(PREFIX + "video.mp4", big, "video/mp4")
    assert faults.is_infrastructure(raised.value)
    front.mend()
    client = await s3.client()
    unfinished = await client.list_multipart_uploads(Bucket=BUCKET, Prefix=s3.prefix)
    assert unfinished.get("Uploads", []) == []  # aborted: no parts are left to be billed for

    # With the store mended, the same file goes in whole.
    assert (await put_verified(s3, PREFIX + "video.mp4", big, "video/mp4", sha256=sha)).bytes == big.stat().st_size


async def test_a_corrupted_store_is_stored_again_until_it_is_intact(backend: Backend, tmp_path: Path):
    mangling = CorruptingStorage(backend.storage, times=2)
    source = tmp_path / "video.mp4"
    sha = _random_file(source, 4096)

    stored = await put_verified(mangling, PREFIX + "video.mp4", source, "video/mp4", sha256=sha, attempts=3)

    assert stored.bytes == 4096 and mangling.corrupted == [PREFIX + "video.mp4"] * 2
    assert await backend.storage.get_bytes(PREFIX + "video.mp4") == source.read_bytes()
    image = b"\x89PNG" + os.urandom(100)
    await put_verified(mangling, PREFIX + "image.png", image, "image/png", sha256=hashlib.sha256(image).hexdigest())
    assert await backend.storage.get_bytes(PREFIX + "image.png") == image


async def test_a_store_that_never_keeps_it_intact_is_a_mismatch_after_the_attempts(backend: Backend, tmp_path: Path):
    mangling = CorruptingStorage(backend.storage, times=99)
    source = tmp_path / "video.mp4"
    sha = _random_file(source, 4096)

    with pytest.raises(ObjectMismatch, match="after 2 stores"):
        await put_verified(mangling, PREFIX + "video.mp4", source, "video/mp4", sha256=sha, attempts=2)
    assert len(mangling.corrupted) == 2
