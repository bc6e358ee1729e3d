"""Provider webhooks: verified with Standard Webhooks, checked to name a render of ours, stored raw once,
announced through the outbox."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from tests.gateway_harness import (
    assert_error,
    assert_no_traceback,
    drive,
    gateway_settings,
    raw_request,
    running_gateway,
)
from tests.support import wait_until
from vidjobs.common import bus, events, signatures
from vidjobs.common.events import InboxReceived
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate
from vidjobs.gateway import inbox


def callback(job_id: str | None, *, render_id: str = "rnd_1", **extra: object) -> bytes:
    """What the fake provider posts when a render finishes."""
    render = {"id": render_id, "status": "succeeded", "metadata": {"job_id": job_id, "attempt": 1}, **extra}
    return json.dumps({"type": "render.succeeded", "data": render}).encode()


BODY = callback(None)  # names no job: verification and shape only


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


@pytest.fixture
async def ours(h) -> bytes:
    """A callback about a job of ours."""
    _, job = await h.post_job(await h.key())
    return callback(job["id"])


async def _post(h, body: bytes, headers: dict[str, str], provider: str = "fake"):
    resp = await h.client.post(f"/v1/webhooks/{provider}", data=body,
                               headers={"Content-Type": "application/json", **headers})
    return resp.status, await resp.json()


async def _nothing_stored(h) -> bool:
    return await h.count("SELECT count(*) FROM webhook_inbox") == 0 and await h.count(
        "SELECT count(*) FROM outbox") == 0


@pytest.mark.parametrize("tamper", ["signature", "body", "secret", "missing", "stale", "future"])
async def test_an_unverifiable_delivery_is_401_and_stores_nothing(h, tamper):
    secret = h.settings.fake_webhook_secret
    headers = signatures.signed_headers(secret, BODY)
    body = BODY
    if tamper == "signature":
        headers["webhook-signature"] = "v1," + "A" * 44
    elif tamper == "body":
        body = BODY.replace(b"succeeded", b"failed")
    elif tamper == "secret":
        headers = signatures.signed_headers(signatures.new_secret(), BODY)
    elif tamper == "missing":
        headers = {}
    elif tamper == "stale":
        headers = signatures.signed_headers(secret, BODY, timestamp=int(time.time()) - 3600)
    elif tamper == "future":
        headers = signatures.signed_headers(secret, BODY, timestamp=int(time.time()) + 3600)

    status, answer = await _post(h, body, headers)

    assert status == 401
    assert_error(answer, "unauthorized")
    assert await _nothing_stored(h)


async def _post_raw(h, provider: str, headers: dict[str, bytes], body: bytes = BODY):
    listed = [(b"Content-Type", b"application/json"), *((k.encode(), v) for k, v in headers.items())]
    return await raw_request(h, "POST", f"/v1/webhooks/{provider}".encode(), listed, body)


@pytest.mark.parametrize("header", ["webhook-signature", "webhook-id", "webhook-timestamp"])
@pytest.mark.parametrize("value", [b"v1,\xff\xfe", b"v1,\xc3\xa9t\xc3\xa9", b"\xe2\x80\xae"])
async def test_a_header_that_is_not_ascii_is_401_not_a_fault(h, caplog, header, value):
    """Header bytes outside ASCII reach the verifier as text it cannot encode back; a sender that writes
    them is refused like any other unverifiable one."""
    headers = {k: v.encode() for k, v in signatures.signed_headers(h.settings.fake_webhook_secret, BODY).items()}
    headers[header] = value

    answer = await _post_raw(h, "fake", headers)

    assert answer.status == 401, answer.body
    assert_error(answer.json(), "unauthorized")
    assert_no_traceback(caplog)
    assert await _nothing_stored(h)


FAL_HEADERS = ["X-Fal-Webhook-Request-Id", "X-Fal-Webhook-User-Id", "X-Fal-Webhook-Timestamp",
               "X-Fal-Webhook-Signature"]


@pytest.mark.parametrize("header", FAL_HEADERS)
async def test_a_fal_header_that_is_not_ascii_is_401_not_a_fault(tmp_path, database_url, nats_url, caplog, header):
    settings = gateway_settings(tmp_path, database_url, nats_url, fal_api_key="fal-test-key",
                                fal_jwks_url="http://127.0.0.1:9/jwks.json")  # nothing listens: no keys, ever
    headers = dict(zip(FAL_HEADERS, [b"764cabcf-b745-4b3e-ae38-1200304cf45b", b"user-1",
                                     str(int(time.time())).encode(), b"00" * 64], strict=True))
    headers[header] = b"\xff\xfe"
    async with running_gateway(settings) as h:
        answer = await _post_raw(h, "fal", headers)

        assert answer.status == 401, answer.body
        assert_error(answer.json(), "unauthorized")
        assert await _nothing_stored(h)
    assert_no_traceback(caplog)


async def test_unknown_provider_is_404(h):
    status, answer = await _post(h, BODY, signatures.signed_headers(h.settings.fake_webhook_secret, BODY), "acme")
    assert status == 404
    assert_error(answer, "not_found")
    assert await _nothing_stored(h)


async def test_a_verified_delivery_is_stored_once_however_often_it_arrives(h, ours):
    secret = h.settings.fake_webhook_secret
    msg_id = signatures.new_message_id()
    # A provider's retries keep the webhook-id and re-sign with a fresh timestamp; some arrive together.
    deliveries = [signatures.signed_headers(secret, ours, msg_id=msg_id, timestamp=int(time.time()) - i)
                  for i in range(4)]

    first = await _post(h, ours, deliveries[0])
    rest = await asyncio.gather(*(_post(h, ours, d) for d in deliveries[1:]))

    assert first == (200, {"received": True, "duplicate": False, "stored": True})
    assert all(r == (200, {"received": True, "duplicate": True, "stored": True}) for r in rest), rest
    rows = await h.pool.fetch("SELECT provider, webhook_id, payload FROM webhook_inbox")
    assert [(r["provider"], r["webhook_id"], bytes(r["payload"])) for r in rows] == [("fake", msg_id, ours)]


@pytest.mark.parametrize("names", ["no job", "another provider's job"])
async def test_a_verified_delivery_naming_no_render_of_ours_is_acknowledged_and_not_stored(h, names):
    _, job = await h.post_job(await h.key(), model="fake-poll/default")
    job_id = {"no job": None, "another provider's job": job["id"]}[names]
    body = callback(job_id)
    jobs_outbox = await h.count("SELECT count(*) FROM outbox")

    status, answer = await _post(h, body, signatures.signed_headers(h.settings.fake_webhook_secret, body))

    assert (status, answer) == (200, {"received": True, "duplicate": False, "stored": False})
    assert await h.count("SELECT count(*) FROM webhook_inbox") == 0
    assert await h.count("SELECT count(*) FROM outbox") <= jobs_outbox  # nothing added (the relay may drain)


async def test_a_verified_delivery_naming_a_job_id_no_row_holds_is_stored_for_the_poller_to_stop(h):
    # Only we start renders that call back here with our job ids: a job id no row holds is a row lost (a
    # failover to an asynchronous standby) whose render goes on; the poller asks the provider to stop it.
    body = callback("job_0123456789")

    status, answer = await _post(h, body, signatures.signed_headers(h.settings.fake_webhook_secret, body))

    assert (status, answer) == (200, {"received": True, "duplicate": False, "stored": True})
    assert await h.count("SELECT count(*) FROM webhook_inbox") == 1


@pytest.mark.parametrize("body", [b"{}", b"[1, 2]", json.dumps({"type": "x", "data": {"id": 7}}).encode()])
async def test_a_verified_delivery_that_is_no_callback_is_400_and_stores_nothing(h, body):
    status, answer = await _post(h, body, signatures.signed_headers(h.settings.fake_webhook_secret, body))
    assert status == 400
    assert_error(answer, "invalid_input", "fake callback")
    assert await _nothing_stored(h)


async def test_a_callback_body_may_be_far_larger_than_an_api_body(h):
    _, job = await h.post_job(await h.key())
    body = callback(job["id"], logs="x" * (1024 * 1024))  # a genuine provider's callback may carry its logs
    assert len(body) > 16 * h.settings.max_body_bytes
    status, answer = await _post(h, body, signatures.signed_headers(h.settings.fake_webhook_secret, body))
    assert (status, answer["stored"]) == (200, True)

    too_big = callback(job["id"], logs="x" * h.settings.webhook_max_body_bytes)
    status, answer = await _post(h, too_big, signatures.signed_headers(h.settings.fake_webhook_secret, too_big))
    assert status == 413
    assert_error(answer, "payload_too_large", "callback")


async def test_a_stored_delivery_is_announced_on_the_inbox_subject(h, nats_url, ours):
    BODY = ours  # noqa: N806 - the callback this test sends
    status, _ = await _post(h, BODY, signatures.signed_headers(h.settings.fake_webhook_secret, BODY))
    assert status == 200
    inbox_id = await h.pool.fetchval("SELECT id FROM webhook_inbox")

    # The gateway's outbox relay publishes the event; read it as the poller's durable consumer would.
    nc = await nats.connect(nats_url)
    try:
        psub = await nc.jetstream().pull_subscribe(events.INBOX, durable="test-inbox", stream=bus.WORK_STREAM)
        [msg] = await psub.fetch(1, timeout=10)
        assert events.decode(msg.subject, msg.data) == InboxReceived(inbox_id=inbox_id, provider="fake")
        assert msg.headers["Nats-Msg-Id"].startswith("outbox-")
        await msg.ack()
    finally:
        await nc.close()

    async def relayed() -> bool:  # published, then removed from the outbox
        return await h.count("SELECT count(*) FROM outbox") == 0

    await wait_until(relayed, within=10, what="the outbox to be emptied")



async def test_callbacks_past_the_providers_rate_are_429_and_not_stored(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, webhook_rate_per_s=0.5, webhook_rate_burst=2)
    async with running_gateway(settings) as h:
        _, job = await h.post_job(await h.key())
        bodies = [callback(job["id"], render_id=f"rnd_{i}") for i in range(3)]
        answers = [await _post(h, b, signatures.signed_headers(settings.fake_webhook_secret, b)) for b in bodies]

        assert [status for status, _ in answers] == [200, 200, 429]
        assert_error(answers[2][1], "rate_limited", "fake callbacks")
        assert await h.count("SELECT count(*) FROM webhook_inbox") == 2
        # A forged delivery is refused before it can use up the rate genuine callbacks need.
        forged = [await _post(h, bodies[0], signatures.signed_headers(signatures.new_secret(), bodies[0]))
                  for _ in range(5)]
        assert {status for status, _ in forged} == {401}


async def test_unsigned_callbacks_are_stored_only_for_a_live_render_of_ours(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, luma_api_key="luma-test-key",
                                luma_url="http://127.0.0.1:9")
    async with running_gateway(settings) as h:
        _, job = await h.post_job(await h.key(), model="luma/ray-2", seed=None)
        generation = "0b3c8a9e-1f2d-4c5b-9a7e-6d5f4e3c2b1a"
        await drive(h.pool, job["id"], JobStatus.SUBMITTED, update=JobUpdate(provider_job_id=generation))

        def luma(gen_id: str) -> bytes:
            return json.dumps({"id": gen_id, "state": "completed"}).encode()

        stranger = await _post(h, luma("9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"), {}, "luma")
        ours = await _post(h, luma(generation), {}, "luma")

        assert stranger == (200, {"received": True, "duplicate": False, "stored": False})
        assert ours == (200, {"received": True, "duplicate": False, "stored": True})
        assert await h.count("SELECT count(*) FROM webhook_inbox") == 1
        await drive(h.pool, job["id"], JobStatus.CANCELED)
        late = await _post(h, luma(generation).replace(b"completed", b"failed"), {}, "luma")
        assert late[1]["stored"] is False  # a finished job's render needs nothing more


async def test_stored_callbacks_are_pruned_after_the_retention(h, ours):
    for age_days in (30, 8, 1):
        await h.pool.execute("INSERT INTO webhook_inbox (provider, webhook_id, payload, received_at) "
                             "VALUES ('fake', $1, $2, now() - make_interval(days => $3))",
                             f"old-{age_days}", ours, age_days)

    removed = await inbox.prune(h.pool, retention_days=7)

    assert removed == 2
    assert [r["webhook_id"] for r in await h.pool.fetch("SELECT webhook_id FROM webhook_inbox")] == ["old-1"]
