"""Image uploads for image-to-video, through the real stack: the gateway reads only the header and stores the
bytes in quarantine, the media worker decodes and cleans the image (never the gateway), the submitter hands
the provider a signed URL, and the fake provider fetches it over HTTP like a real one."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path
from typing import Any

import asyncpg
import nats.js.errors
import pytest
from PIL import Image

from tests import imagefiles
from tests.stack import Stack, demo_key, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import bus, events
from vidjobs.storage.base import quarantine_key


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(tmp_path, database_url, nats_url)


async def upload(stack: Stack, data: bytes, content_type: str, *, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key or stack.key}", "Content-Type": content_type}
    async with stack.session.post(f"{stack.url}/v1/uploads", data=data, headers=headers) as resp:
        return resp.status, await resp.json()


async def post_job(stack: Stack, key: str, **body: Any) -> tuple[int, Any]:
    payload = {"model": "fake/default", "prompt": "the picture comes alive", "duration_s": 1, **body}
    async with stack.session.post(f"{stack.url}/v1/jobs", json=payload,
                                  headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.json()


async def upload_row(database_url: str, upload_id: str) -> asyncpg.Record:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchrow("SELECT * FROM uploads WHERE id = $1", upload_id)
    finally:
        await conn.close()


def quarantined(stack: Stack, row: asyncpg.Record) -> bool:
    """Whether the upload's raw bytes still wait in quarantine."""
    root = Path(stack.settings.storage_url.removeprefix("file://"))
    return (root / quarantine_key(row["account_id"], row["id"])).exists()


def stored_object(stack: Stack, key: str) -> bytes:
    root = Path(stack.settings.storage_url.removeprefix("file://"))
    return (root / key).read_bytes()


def assert_no_metadata(data: bytes) -> None:
    image = Image.open(io.BytesIO(data))
    assert not image.getexif(), dict(image.getexif())
    assert not {"exif", "xmp", "comment", "Author", "XML:com.adobe.xmp", "icc_profile"} & set(image.info), image.info
    assert imagefiles.SECRET.encode() not in data and b"Exif" not in data and b"shot at home" not in data


async def test_images_are_sniffed_turned_upright_and_stored_without_metadata(settings):
    cases = [
        # body, the Content-Type the client claims, what it really is, upright width and height
        (imagefiles.png_with_text((30, 10)), "image/png", "image/png", 30, 10),
        # EXIF orientation 6 (turn 90 degrees clockwise to view): stored 40 x 20, upright 20 x 40.
        (imagefiles.jpeg_with_gps((40, 20), orientation=6), "image/jpeg", "image/jpeg", 20, 40),
        (imagefiles.webp_with_xmp((33, 17)), "image/webp", "image/webp", 33, 17),
        # The header's claim is ignored either way: the bytes decide.
        (imagefiles.jpeg_with_gps((12, 8), orientation=1), "application/octet-stream", "image/jpeg", 12, 8),
        (imagefiles.png_with_text((8, 6)), "image/jpeg", "image/png", 8, 6),
    ]
    async with running_stack(settings) as stack:
        for body, claimed, real, width, height in cases:
            status, taken = await upload(stack, body, claimed)

            assert status == 201, taken
            assert set(taken) == {"id", "status", "width", "height", "content_type", "bytes", "error"}
            assert (taken["status"], taken["content_type"], taken["bytes"]) == ("processing", real, len(body))
            out = await stack.wait_upload(taken["id"])
            assert out["status"] == "ready" and out["error"] is None, out
            assert out["id"].startswith("upl_") and (out["width"], out["height"]) == (width, height)
            assert out["content_type"] == real
            row = await upload_row(settings.database_url, out["id"])
            assert not quarantined(stack, row)
            assert row["key"].startswith(f"accounts/{row['account_id']}/uploads/{out['id']}/image.")
            stored = stored_object(stack, row["key"])
            assert len(stored) == out["bytes"] == row["bytes"]
            assert hashlib.sha256(stored).hexdigest() == row["sha256"]
            assert Image.open(io.BytesIO(stored)).size == (width, height)
            assert_no_metadata(stored)

        # Turned upright: the left half (red) of the sideways photo is now on top.
        row = await upload_row(settings.database_url, (await stack.ready_upload(cases[1][0], "image/jpeg"))["id"])
        upright = Image.open(io.BytesIO(stored_object(stack, row["key"]))).convert("RGB")
        red, blue = upright.getpixel((10, 5)), upright.getpixel((10, 35))
        assert red[0] > 150 > red[2] and blue[2] > 150 > blue[0], (red, blue)
        async with stack.session.get(f"{stack.url}/openapi.json") as resp:
            doc = await resp.json()

    operation = doc["paths"]["/v1/uploads"]["post"]
    assert operation["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith("/UploadOut")
    assert {"413", "415", "422"} <= set(operation["responses"]) and operation["security"]
    assert set(doc["components"]["schemas"]["UploadOut"]["properties"]) == {
        "id", "status", "width", "height", "content_type", "bytes", "error"}
    assert doc["paths"]["/v1/uploads/{upload_id}"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"]["$ref"].endswith("/UploadOut")


async def test_a_job_animates_the_stored_image_and_the_provider_fetches_exactly_it(settings):
    async with running_stack(settings) as stack:
        up = await stack.ready_upload(imagefiles.jpeg_with_gps((64, 36), orientation=1), "image/jpeg")

        created = await stack.create_job(input_image=up["id"], params={"render_s": 0.2})
        job = await stack.wait_terminal(created["id"])

        assert job["status"] == "completed", job
        row = await upload_row(settings.database_url, up["id"])
        stored = stored_object(stack, row["key"])
        fetched = (await stack.counters())["input_images"][job["id"]]
        assert fetched["sha256"] == hashlib.sha256(stored).hexdigest() == row["sha256"]
        assert (fetched["bytes"], fetched["format"]) == (len(stored), "JPEG")
        assert (fetched["width"], fetched["height"]) == (64, 36)


async def test_only_the_callers_own_live_upload_can_be_named(settings):
    async with running_stack(settings) as stack:
        other_key = await demo_key(settings.database_url)
        mine = await stack.ready_upload(imagefiles.png_with_text())
        theirs = await stack.as_key(other_key).ready_upload(imagefiles.png_with_text())

        foreign = await post_job(stack, stack.key, input_image=theirs["id"])
        unknown = await post_job(stack, stack.key, input_image="upl_0000000000nosuchupload00000")
        own = await post_job(stack, stack.key, input_image=mine["id"], params={"render_s": 0.2})

        for (status, body), named in [(foreign, theirs["id"]), (unknown, "upl_0000000000nosuchupload00000")]:
            assert status == 422, body
            assert body["error"]["code"] == "invalid_input" and not body["error"]["retryable"]
            # The same words for both: another account's upload cannot be told from one that never existed.
            assert body["error"]["message"] == foreign[1]["error"]["message"].replace(theirs["id"], named)
            assert "input_image: no such upload" in body["error"]["message"]
        assert own[0] == 201, own
        conn = await asyncpg.connect(settings.database_url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM jobs") == 1
        finally:
            await conn.close()
        assert (await stack.wait_terminal(own[1]["id"]))["status"] == "completed"


async def test_an_image_gone_before_submission_fails_the_job_as_invalid_input(settings):
    async with running_stack(settings) as stack:
        row_gone = await stack.ready_upload(imagefiles.png_with_text())
        object_gone = await stack.ready_upload(imagefiles.png_with_text())
        await stack.supervisor.stop("submitter")  # so both jobs wait while their images disappear
        first = await stack.create_job(input_image=row_gone["id"], params={"render_s": 0.2})
        second = await stack.create_job(input_image=object_gone["id"], params={"render_s": 0.2})
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute("UPDATE uploads SET deleted_at = now() WHERE id = $1", row_gone["id"])
            key = await conn.fetchval("SELECT key FROM uploads WHERE id = $1", object_gone["id"])
        finally:
            await conn.close()
        (Path(settings.storage_url.removeprefix("file://")) / key).unlink()

        await stack.supervisor.start("submitter")
        refused = await stack.wait_terminal(first["id"])
        unfetchable = await stack.wait_terminal(second["id"])
        counters = await stack.counters()

    # The submitter finds no upload: nothing reaches the provider.
    assert refused["status"] == "failed" and refused["error"]["code"] == "invalid_input", refused
    assert "no longer exists" in refused["error"]["message"]
    assert first["id"] not in counters["submissions_by_job"]
    # The provider cannot fetch the image (the signed URL answers 404): it fails the render, not retried.
    assert unfetchable["status"] == "failed" and unfetchable["error"]["code"] == "invalid_input", unfetchable
    assert "input_image_url" in unfetchable["error"]["message"] and unfetchable["attempt"] == 1


async def test_uploads_past_the_daily_cap_are_429_and_store_nothing(tmp_path, database_url, nats_url):
    from tests.gateway_harness import assert_error, auth, gateway_settings, running_gateway

    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url, max_uploads_per_day=2)) as h:
        account_id, key = await h.account()
        _, other = await h.account()

        async def send(with_key: str) -> tuple[int, Any, dict]:
            resp = await h.client.post("/v1/uploads", data=imagefiles.png_with_text(),
                                       headers={**auth(with_key), "Content-Type": "image/png"})
            return resp.status, await resp.json(), dict(resp.headers)

        racing = await asyncio.gather(*(send(key) for _ in range(6)))

        assert sorted(status for status, _, _ in racing) == [201, 201, 429, 429, 429, 429]
        _, refused, headers = next(r for r in racing if r[0] == 429)
        assert_error(refused, "limit_reached", "2 image uploads", "00:00 UTC")
        assert 1 <= int(headers["Retry-After"]) <= 86400
        assert await h.count("SELECT count(*) FROM uploads WHERE account_id = $1", account_id) == 2
        root = Path(h.settings.storage_url.removeprefix("file://")) / "accounts" / account_id / "uploads"
        assert len(list(root.iterdir())) == 2  # a refused upload leaves no object behind
        assert (await send(other))[0] == 201  # another account's day is its own
        _, account = await h.get(key, "/v1/account")
        assert (account["uploads_today"], account["limits"]["max_uploads_per_day"]) == (2, 2)


async def test_an_upload_the_store_mangles_is_stored_again_or_refused_with_503(tmp_path, database_url, nats_url):
    from tests.corrupting import CorruptingStorage
    from tests.gateway_harness import assert_error, auth, gateway_settings, running_gateway

    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url, store_verify_attempts=2)) as h:
        account_id, key = await h.account()
        real = h.gw.storage
        image = imagefiles.png_with_text()

        async def send() -> tuple[int, Any]:
            resp = await h.client.post("/v1/uploads", data=image,
                                       headers={**auth(key), "Content-Type": "image/png"})
            return resp.status, await resp.json()

        h.gw.storage = CorruptingStorage(real, times=1)
        status, body = await send()
        assert status == 201, body
        # What the gateway keeps is the upload as sent, in quarantine until the media worker decodes it.
        row = await h.pool.fetchrow("SELECT bytes, sha256 FROM uploads WHERE id = $1", body["id"])
        kept = await real.get_bytes(quarantine_key(account_id, body["id"]))
        assert kept == image
        assert (len(kept), hashlib.sha256(kept).hexdigest()) == (row["bytes"], row["sha256"])

        h.gw.storage = CorruptingStorage(real, times=99)  # every store mangled: the store is not usable
        status, body = await send()
        assert status == 503, body
        assert_error(body, "unavailable")
        assert await h.count("SELECT count(*) FROM uploads WHERE account_id = $1", account_id) == 1


async def test_an_upload_to_a_store_answering_heads_without_a_size_is_503_and_deferred_by_the_media_worker(
        tmp_path, database_url, nats_url, s3_server, monkeypatch):
    """An S3-compatible store (or an HTTP front before it) that answers HEAD without Content-Length: the
    gateway's read-back of an upload, and the media worker's look-up of it, meet the store misbehaving."""
    import secrets

    from tests.faults.s3front import S3Front
    from tests.gateway_harness import assert_error, auth, decode_upload, gateway_settings, running_gateway
    from tests.s3server import TEST_BUCKET
    from vidjobs.common import faults
    from vidjobs.storage.base import StorageUnavailable

    async with S3Front(s3_server.endpoint).running() as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.url)  # the gateway's S3 client reaches moto through it
        settings = gateway_settings(tmp_path, database_url, nats_url,
                                    storage_url=f"s3://{TEST_BUCKET}/uploads-{secrets.token_hex(4)}")
        async with running_gateway(settings) as h:
            account_id, key = await h.account()

            async def send() -> tuple[int, Any, dict]:
                resp = await h.client.post("/v1/uploads", data=imagefiles.png_with_text(),
                                           headers={**auth(key), "Content-Type": "image/png"})
                return resp.status, await resp.json(), dict(resp.headers)

            front.drop_from_heads("Content-Length")
            status, body, headers = await send()
            assert status == 503, body
            assert_error(body, "unavailable")
            assert body["error"]["retryable"] is True and int(headers["Retry-After"]) >= 1, (body, headers)
            assert await h.count("SELECT count(*) FROM uploads WHERE account_id = $1", account_id) == 0

            front.mend()
            status, taken, _ = await send()
            assert status == 201, taken

            # The media worker's look-up of the quarantined bytes (a HEAD, for their size) meets the same store.
            front.drop_from_heads("Content-Length")
            with pytest.raises(StorageUnavailable) as raised:
                await decode_upload(h, taken["id"])
            assert faults.is_infrastructure(raised.value)  # the bus defers it; no try is spent, none dead-letters
            assert (await h.get(key, f"/v1/uploads/{taken['id']}"))[1]["status"] == "processing"

            front.mend()
            await decode_upload(h, taken["id"])
            assert (await h.get(key, f"/v1/uploads/{taken['id']}"))[1]["status"] == "ready"


def maps_pillow(pid: int) -> bool:
    """Whether the process has Pillow's compiled decoder loaded: `import PIL.Image` maps it, and nothing
    unloads it again."""
    return "/PIL/" in Path(f"/proc/{pid}/maps").read_text()


async def test_an_upload_is_decoded_by_the_media_worker_and_never_by_the_gateway(settings):
    async with running_stack(settings) as stack:
        await stack.supervisor.stop("media")
        sideways = imagefiles.jpeg_with_gps((40, 20), orientation=6)
        taken = await stack.upload(sideways, "image/jpeg")
        # As the header declares it, before anything is decoded: not yet turned upright.
        assert (taken["status"], taken["width"], taken["height"]) == ("processing", 40, 20), taken
        row = await upload_row(settings.database_url, taken["id"])
        root = Path(settings.storage_url.removeprefix("file://"))
        assert quarantined(stack, row) and not (root / row["key"]).exists()

        # Its message is in the stream, and with the media worker down nothing else decodes it.
        nc, js = await bus.connect(settings.nats_url, "test")
        try:
            sent = await wait_until(lambda: _last_upload_message(js), what="the upload's message")
        finally:
            await nc.close()
        assert events.decode(events.UPLOADS, sent) == events.UploadReceived(upload_id=taken["id"])
        async with stack.session.get(f"{stack.url}/v1/uploads/{taken['id']}", headers=stack.auth) as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "processing"
        async with stack.session.post(f"{stack.url}/v1/jobs", headers=stack.auth, json={
                "model": "fake/default", "prompt": "too soon", "duration_s": 1, "input_image": taken["id"]}) as resp:
            early, retry_after = await resp.json(), resp.headers.get("Retry-After")
            assert resp.status == 409, early
        assert early["error"]["code"] == "upload_not_ready" and early["error"]["retryable"], early
        assert f"GET /v1/uploads/{taken['id']}" in early["error"]["message"] and retry_after == "1"

        await stack.supervisor.start("media")
        ready = await stack.wait_upload(taken["id"])
        assert (ready["status"], ready["width"], ready["height"]) == ("ready", 20, 40), ready
        assert not quarantined(stack, row)
        assert hashlib.sha256(stored_object(stack, row["key"])).hexdigest() == \
            (await upload_row(settings.database_url, taken["id"]))["sha256"]
        job = await stack.wait_terminal((await stack.create_job(input_image=ready["id"],
                                                                params={"render_s": 0.2}))["id"])
        assert job["status"] == "completed", job

        # Through all of it, the gateway never loaded an image decoder; the media worker that decoded did.
        gateway_pid, media_pid = stack.supervisor.pid("gateway"), stack.supervisor.pid("media")
        assert gateway_pid is not None and media_pid is not None
        assert not maps_pillow(gateway_pid) and maps_pillow(media_pid)


async def _last_upload_message(js) -> bytes | None:
    try:
        return (await js.get_last_msg(bus.WORK_STREAM, events.UPLOADS)).data
    except nats.js.errors.NotFoundError:
        return None


async def test_bad_images_and_bombs_are_rejected_by_the_media_worker(settings):
    cases = [
        # body, the reason code, words the message holds
        (imagefiles.truncated_png(), "image_corrupt", "truncated or corrupt"),
        # Its header declares 8 x 8 pixels: only decoding finds the 64 MiB its text chunk inflates to.
        (imagefiles.text_chunk_bomb(), "image_too_large", "decompression bomb"),
    ]
    async with running_stack(settings) as stack:
        for body, reason, words in cases:
            taken = await stack.upload(body)
            assert taken["status"] == "processing", taken

            decided = await stack.wait_upload(taken["id"])

            assert decided["status"] == "rejected", decided
            assert decided["error"]["code"] == reason and words in decided["error"]["message"], decided
            row = await upload_row(settings.database_url, taken["id"])
            assert (row["status"], row["reason"]) == ("rejected", reason)
            root = Path(settings.storage_url.removeprefix("file://"))
            assert not quarantined(stack, row) and not (root / row["key"]).exists()  # nothing of it is kept
            status, refused = await post_job(stack, stack.key, input_image=taken["id"])
            assert status == 422 and refused["error"]["code"] == "upload_rejected", refused
            assert reason in refused["error"]["message"] and not refused["error"]["retryable"]
        media_pid = stack.supervisor.pid("media")
        assert media_pid is not None and stack.supervisor.pid("media") == media_pid  # no decode took it down


async def test_an_upload_left_processing_is_rejected_past_its_deadline_and_its_bytes_removed(
        tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, upload_processing_deadline_s=1.0,
                              retention_sweep_interval_s=0.5)
    async with running_stack(settings) as stack:
        await stack.supervisor.stop("media")  # down for longer than the deadline
        taken = await stack.upload(imagefiles.png_with_text())

        decided = await stack.wait_upload(taken["id"])

        assert decided["status"] == "rejected" and decided["error"]["code"] == "image_unprocessed", decided
        row = await upload_row(settings.database_url, taken["id"])
        assert quarantined(stack, row)  # until a media worker is back
        await stack.supervisor.start("media")
        # Its message is delivered once media runs: the upload is decided, so only its bytes go.
        await wait_until(lambda: _gone(stack, row), what="the quarantined bytes to be removed")
        assert (await stack.wait_upload(taken["id"]))["status"] == "rejected"


async def _gone(stack: Stack, row: asyncpg.Record) -> bool:
    return not quarantined(stack, row)


async def test_the_media_handler_is_safe_to_run_again_and_a_dead_letter_rejects(tmp_path, database_url, nats_url):
    from tests.gateway_harness import auth, decode_upload, gateway_settings, running_gateway
    from vidjobs.media import quarantine

    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as h:
        _, key = await h.account()

        async def taken() -> dict:
            resp = await h.client.post("/v1/uploads", data=imagefiles.png_with_text(),
                                       headers={**auth(key), "Content-Type": "image/png"})
            assert resp.status == 201 and resp.headers["Location"].startswith("/v1/uploads/upl_")
            return await resp.json()

        decoded, hopeless = await taken(), await taken()
        await decode_upload(h, decoded["id"])
        await decode_upload(h, decoded["id"])  # a duplicate delivery changes nothing
        await quarantine.on_dead(quarantine.Quarantine.of(h.gw.rt, h.gw.storage),
                                 events.UploadReceived(upload_id=hopeless["id"]))

        _, ready = await h.get(key, f"/v1/uploads/{decoded['id']}")
        _, rejected = await h.get(key, f"/v1/uploads/{hopeless['id']}")
        assert (ready["status"], ready["width"], ready["height"]) == ("ready", 30, 10), ready
        assert rejected["status"] == "rejected" and rejected["error"]["code"] == "image_unprocessed", rejected
        root = Path(h.settings.storage_url.removeprefix("file://"))
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                       if p.is_file() and p.suffix != ".content-type")
        assert files == [(await upload_row(database_url, decoded["id"]))["key"]]  # no quarantined bytes left
        assert (await h.get(key, "/v1/uploads/upl_nosuchupload"))[0] == 404
