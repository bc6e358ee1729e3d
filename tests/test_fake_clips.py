"""The fake provider's real clips: the requested resolution, aspect and duration at 24 fps and a provider's
bitrate, encoded once per distinct request however many ask at once, kept on disk under a size cap; and its
tiny clips stay the default."""

from __future__ import annotations

import asyncio
import io
import secrets
from pathlib import Path

import aiohttp
import av
import pytest
from av.video.frame import PictureType

from vidjobs.common import ids
from vidjobs.common.jobs import JobRequest
from vidjobs.common.signatures import new_secret
from vidjobs.fakeprovider.clip_cache import ClipCache
from vidjobs.fakeprovider.clips import BITRATE_KBPS, ClipKind, real_spec
from vidjobs.fakeprovider.serving import running_fake_provider
from vidjobs.providers.base import ProviderState, SubmitRequest
from vidjobs.providers.fake.adapter import FakeAdapter


def probe(data: bytes) -> tuple[int, int, float, int, float]:
    """Width, height, duration, decoded frames and frame rate of an MP4."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        assert stream.codec_context.name == "h264"
        return stream.width, stream.height, container.duration / av.time_base, frames, float(stream.average_rate)


async def rendered(adapter: FakeAdapter, http: aiohttp.ClientSession, **request) -> bytes:
    job_id = ids.new("job")
    params = {"render_s": 0, **request.pop("params", {})}
    job = JobRequest(model="fake/default", prompt="a red fox in snow", params=params, **request)
    accepted = await adapter.submit(SubmitRequest(job_id=job_id, attempt=1, idempotency_key=job_id, request=job))
    for _ in range(400):
        sig = await adapter.status(accepted.provider_job_id)
        if sig.state is ProviderState.SUCCEEDED:
            break
        await asyncio.sleep(0.05)
    assert sig.state is ProviderState.SUCCEEDED and sig.output_url
    async with http.get(sig.output_url) as resp:
        assert resp.status == 200
        return await resp.read()


@pytest.mark.parametrize(("aspect_ratio", "resolution", "size"), [
    ("16:9", "480p", (854, 480)), ("9:16", "720p", (720, 1280)), ("1:1", "480p", (480, 480))])
async def test_a_real_clip_has_the_requested_size_duration_and_a_provider_s_bitrate(
        tmp_path: Path, http: aiohttp.ClientSession, aspect_ratio: str, resolution: str, size: tuple[int, int]):
    secret = new_secret()
    cache = ClipCache(tmp_path, 1 << 30)
    async with running_fake_provider(webhook_secret=secret, clip=ClipKind.REAL, clip_cache=cache) as provider:
        adapter = FakeAdapter(http, provider.url, secret)
        data = await rendered(adapter, http, duration_s=2, aspect_ratio=aspect_ratio, resolution=resolution)

    width, height, duration, frames, fps = probe(data)
    assert (width, height, duration, frames, fps) == (*size, 2.0, 48, 24.0)
    kbps = len(data) * 8 / 1000 / duration
    target = BITRATE_KBPS[int(resolution[:-1])]
    print(f"\n{aspect_ratio} {resolution}: {len(data) / 1e6:.2f} MB for 2 s, {kbps:.0f} kbit/s (target {target})")
    assert 0.6 * target < kbps < 1.4 * target
    assert cache.encoded == 1


async def test_tiny_clips_stay_the_default_and_a_job_may_ask_for_a_real_one(tmp_path: Path,
                                                                          http: aiohttp.ClientSession):
    secret = new_secret()
    cache = ClipCache(tmp_path, 1 << 30)
    async with running_fake_provider(webhook_secret=secret, clip_cache=cache) as provider:
        adapter = FakeAdapter(http, provider.url, secret)
        tiny = await rendered(adapter, http, duration_s=1, resolution="1080p")
        real = await rendered(adapter, http, duration_s=1, resolution="480p", aspect_ratio="1:1",
                              params={"clip": "real"})
    assert probe(tiny)[:2] == (320, 180) and probe(tiny)[4] == 12.0
    assert probe(real)[:2] == (480, 480) and probe(real)[4] == 24.0
    assert cache.encoded == 1  # the tiny clip never touched the disk


async def test_concurrent_asks_for_one_clip_encode_it_once(tmp_path: Path):
    cache = ClipCache(tmp_path, 1 << 30)
    spec = real_spec("16:9", "480p", 0.5, secrets.randbelow(2**31))

    paths = await asyncio.gather(*(cache.get(spec) for _ in range(5)))

    assert len(set(paths)) == 1 and paths[0].stat().st_size > 0
    assert await cache.get(spec) == paths[0]
    assert cache.encoded == 1
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]  # no temporary file left behind


async def test_the_cache_stays_under_its_size_removing_the_clips_used_longest_ago(tmp_path: Path):
    specs = [real_spec("1:1", "480p", 0.5, seed) for seed in (1, 2, 3)]
    probe_cache = ClipCache(tmp_path / "probe", 1 << 30)
    one_clip = max([(await probe_cache.get(spec)).stat().st_size for spec in specs])
    cache = ClipCache(tmp_path / "capped", 2 * one_clip + one_clip // 2)  # room for two clips, not three

    first = await cache.get(specs[0])
    await cache.get(specs[1])
    await asyncio.sleep(0.02)
    await cache.get(specs[0])  # used again: now the second is the one used longest ago
    third = await cache.get(specs[2])

    kept = {p.name for p in (tmp_path / "capped").iterdir()}
    assert kept == {first.name, third.name}
    assert sum(p.stat().st_size for p in (tmp_path / "capped").iterdir()) <= cache.max_bytes
    await cache.get(specs[1])  # asked for again: encoded again
    assert cache.encoded == 4


async def test_a_real_clip_has_the_frame_types_a_providers_render_has(tmp_path: Path):
    """High profile with B-frames, some of which no other frame references (what x264 makes of a provider's
    picture): the frames the media service may leave undecoded are there to leave."""
    video = await ClipCache(tmp_path, 1 << 30).get(real_spec("16:9", "480p", 2, seed=7))

    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        kinds = {PictureType(frame.pict_type).name for frame in container.decode(stream)}
        profile = stream.codec_context.profile
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"
        referenced = sum(1 for _ in container.decode(stream))

    assert profile == "High"
    assert {"I", "P", "B"} <= kinds
    assert 0 < referenced < 48
