"""A 100 MB render streams from the provider to storage with flat memory in the media service.

The fake provider pads its MP4 to 100 MB (a trailing `free` box: still a valid MP4) and streams it. The media
service's peak resident memory (VmHWM) is read from /proc before and after the copy and printed; the copy
must not add anything near the file's size to it.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest

from tests.s3server import TEST_BUCKET
from tests.stack import running_stack, stack_settings

SIZE_MB = 100
# Chunks of 1 MB, hashing and writing threads, the decoder on the first frames: a few tens of MB at most.
ALLOWED_GROWTH_MB = 48


@pytest.fixture(params=["file", "s3"])
def settings(request: pytest.FixtureRequest, tmp_path, database_url, nats_url):
    if request.param == "file":
        return stack_settings(tmp_path, database_url, nats_url)
    request.getfixturevalue("s3_server")  # multipart upload, one part in memory at a time
    return stack_settings(tmp_path, database_url, nats_url,
                          storage_url=f"s3://{TEST_BUCKET}/large-{secrets.token_hex(4)}")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


async def test_a_100_mb_render_streams_to_storage_with_flat_memory(settings):
    async with running_stack(settings) as stack:
        # A small job first, so the baseline includes everything a copy loads (decoder, encoder, threads).
        warm = await stack.create_job(params={"render_s": 0})
        assert (await stack.wait_terminal(warm["id"]))["status"] == "completed"
        pid = stack.supervisor.pid("media")
        assert pid is not None
        before = peak_rss_mb(pid)

        big = await stack.create_job(params={"render_s": 0, "output_mb": SIZE_MB})
        job = await stack.wait_terminal(big["id"], within=180)

        assert job["status"] == "completed", job
        after = peak_rss_mb(pid)
        out = job["outputs"]
        backend = settings.storage_url.split(":")[0]
        print(f"\n100 MB render to {backend}: media peak RSS {before:.1f} MB before, {after:.1f} MB after "
              f"(+{after - before:.1f} MB) for a {out['bytes'] / 1e6:.0f} MB file")
        assert out["bytes"] == SIZE_MB * 1_000_000
        assert after - before < ALLOWED_GROWTH_MB, f"peak RSS grew {after - before:.1f} MB copying {SIZE_MB} MB"
        digest, size = hashlib.sha256(), 0
        async with stack.session.get(out["video_url"]) as resp:
            assert resp.status == 200
            async for chunk in resp.content.iter_chunked(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        assert (size, digest.hexdigest()) == (out["bytes"], out["sha256"])
        assert out["preview_url"] and out["width"] > 0 and out["duration_s"] > 0
