"""The whole stack on the S3 backend: every service its own process, storing into moto's S3 server on
loopback; clients read the render by presigned S3 URL, and a deleted job's objects leave the bucket."""

from __future__ import annotations

import hashlib
import io
import secrets
from collections.abc import AsyncIterator

import av
import pytest
from PIL import Image

from tests.s3server import TEST_BUCKET, MotoS3
from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from vidjobs.storage.s3 import S3Storage

BUCKET = TEST_BUCKET


@pytest.fixture
def prefix() -> str:
    return f"stack-{secrets.token_hex(4)}"


@pytest.fixture
async def bucket(s3_server: MotoS3, prefix: str) -> AsyncIterator[S3Storage]:
    """The test's own view of what the services store under their prefix."""
    storage = S3Storage(BUCKET, prefix)
    yield storage
    await storage.close()


async def _objects_of(bucket: S3Storage, job_id: str) -> list[str]:
    return [info.key async for info in bucket.list_prefix("accounts/") if f"/jobs/{job_id}/" in info.key]


def _decodes_as_video(data: bytes) -> bool:
    with av.open(io.BytesIO(data)) as container:
        return next(container.decode(video=0), None) is not None


async def test_a_job_stored_on_s3_is_served_by_presigned_url_and_removed_on_delete(
    tmp_path, database_url, nats_url, s3_server: MotoS3, bucket: S3Storage, prefix: str,
):
    settings = stack_settings(tmp_path, database_url, nats_url, storage_url=f"s3://{BUCKET}/{prefix}")
    async with running_stack(settings) as stack:
        created = await stack.create_job(params={"render_s": 0.3})
        job = await stack.wait_terminal(created["id"])
        assert job["status"] == "completed", job
        out = job["outputs"]

        # The links are S3's own: presigned, on the S3 endpoint, not the gateway's files route.
        assert out["video_url"].startswith(f"{s3_server.endpoint}/{BUCKET}/{prefix}/accounts/")
        assert "X-Amz-Signature=" in out["video_url"]
        status, video, _ = await stack.download(out["video_url"])
        assert status == 200
        assert len(video) == out["bytes"] and hashlib.sha256(video).hexdigest() == out["sha256"]
        assert _decodes_as_video(video)
        status, thumb, _ = await stack.download(out["thumbnail_url"])
        assert status == 200 and Image.open(io.BytesIO(thumb)).format == "JPEG"
        status, _, _ = await stack.download(f"{stack.url}/files/{prefix}/anything")
        assert status == 404  # the files route is not mounted for S3
        assert len(await _objects_of(bucket, job["id"])) >= 2

        async with stack.session.delete(f"{stack.url}/v1/jobs/{job['id']}", headers=stack.auth) as resp:
            assert resp.status == 204

        async def bucket_emptied() -> bool:
            return not await _objects_of(bucket, job["id"])

        await wait_until(bucket_emptied, within=30, what=f"the objects of {job['id']} to leave the bucket")
