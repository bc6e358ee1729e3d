"""A finished job's outputs: signed URLs that serve the bytes (with Range), and refuse anything else."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.gateway_harness import (
    assert_error,
    assert_no_traceback,
    completed_job,
    drive,
    gateway_settings,
    raw_request,
    running_gateway,
)
from vidjobs.common.states import JobStatus
from vidjobs.storage import signing

VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


def _path(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


async def _outputs(h) -> dict:
    account_id, key = await h.account()
    job = await completed_job(h, account_id, video=VIDEO)
    status, body = await h.get(key, f"/v1/jobs/{job.id}")
    assert status == 200 and body["status"] == "completed" and body["stage"] == "ready"
    return body["outputs"]


async def test_a_completed_job_links_its_files_by_signed_url(h):
    out = await _outputs(h)

    assert out["video_url"].startswith(h.settings.gateway_url + "/files/")
    assert out["preview_url"] is None
    assert (out["width"], out["height"], out["bytes"]) == (1280, 720, len(VIDEO))
    assert out["expires_at"].endswith("Z")
    resp = await h.client.get(_path(out["video_url"]))
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "video/mp4"
    assert await resp.read() == VIDEO
    thumb = await h.client.get(_path(out["thumbnail_url"]))
    assert thumb.status == 200 and thumb.headers["Content-Type"] == "image/jpeg"


async def test_range_requests_serve_part_of_a_video(h):
    out = await _outputs(h)

    resp = await h.client.get(_path(out["video_url"]), headers={"Range": "bytes=100-199"})

    assert resp.status == 206
    assert resp.headers["Content-Range"] == f"bytes 100-199/{len(VIDEO)}"
    assert await resp.read() == VIDEO[100:200]
    head = await h.client.head(_path(out["video_url"]))
    assert head.status == 200 and int(head.headers["Content-Length"]) == len(VIDEO)


async def test_tampered_or_expired_links_are_403(h):
    out = await _outputs(h)
    url = urlsplit(out["video_url"])
    query = parse_qs(url.query)
    expires, sig = query["expires"][0], query["sig"][0]
    other_key = url.path.replace("video.mp4", "thumb.jpg")
    stale_url, _ = signing.sign("", h.settings.signing_secret, url.path.removeprefix("/files/"), -10)

    for path in [
        f"{url.path}?expires={expires}&sig={'0' * len(sig)}",  # signature changed
        f"{url.path}?expires={int(expires) + 60}&sig={sig}",  # expiry pushed out
        f"{other_key}?expires={expires}&sig={sig}",  # another object
        f"{url.path}",  # no signature at all
        stale_url,  # correctly signed, but expired
    ]:
        resp = await h.client.get(path)
        assert resp.status == 403, path
        assert_error(await resp.json(), "forbidden")
    assert (await h.client.post(_path(out["video_url"]))).status == 405


@pytest.mark.parametrize("sig", [b"%C3%A9", b"%FF%FE", b"caf%C3%A9" + b"0" * 60, b"%00"])
async def test_a_signature_that_is_not_hex_is_403_not_a_fault(h, caplog, sig):
    """Unexpired and for a real key, so the signature itself is compared, though it decodes to no hex digest."""
    url, _ = signing.sign("", h.settings.signing_secret, "accounts/a/jobs/j/video.mp4", 60)
    target = _path(url).split("&sig=")[0].encode() + b"&sig=" + sig

    answer = await raw_request(h, "GET", target, [])

    assert answer.status == 403, answer.body
    assert_error(answer.json(), "forbidden")
    assert_no_traceback(caplog)


async def test_a_signed_key_outside_the_storage_root_is_refused(h):
    for key in ["../secrets.json", "accounts/../../x"]:
        url, _ = signing.sign("", h.settings.signing_secret, key, 60)
        resp = await h.client.get(url)
        assert resp.status in (403, 404), key
        assert (await resp.read()).startswith(b'{"error"')


async def test_an_expired_job_keeps_only_its_thumbnail(h):
    account_id, key = await h.account()
    job = await completed_job(h, account_id)
    await drive(h.pool, job.id, JobStatus.EXPIRED)
    status, body = await h.get(key, f"/v1/jobs/{job.id}")
    assert status == 200 and body["stage"] == "expired"
    out = body["outputs"]
    assert out["video_url"] is None and out["preview_url"] is None and out["thumbnail_url"]
    assert out["retained_until"] == body["updated_at"]  # it was retained until it expired
