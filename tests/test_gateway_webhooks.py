"""Provider webhooks: verified with Standard Webhooks, stored raw once, announced through the outbox."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from libs.common import bus, events
from libs.common.events import InboxReceived
from libs.providers import webhooks
from tests.support import wait_until
from tests.test_gateway_harness import assert_error, gateway_settings, running_gateway

BODY = json.dumps({"type": "job.succeeded", "id": "prov_1"}).encode()


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


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
    headers = webhooks.signed_headers(secret, BODY)
    body = BODY
    if tamper == "signature":
        headers["webhook-signature"] = "v1," + "A" * 44
    elif tamper == "body":
        body = BODY.replace(b"succeeded", b"failed")
    elif tamper == "secret":
        headers = webhooks.signed_headers(webhooks.new_secret(), BODY)
    elif tamper == "missing":
        headers = {}
    elif tamper == "stale":
        headers = webhooks.signed_headers(secret, BODY, timestamp=int(time.time()) - 3600)
    elif tamper == "future":
        headers = webhooks.signed_headers(secret, BODY, timestamp=int(time.time()) + 3600)

    status, answer = await _post(h, body, headers)

    assert status == 401
    assert_error(answer, "unauthorized")
    assert await _nothing_stored(h)


async def test_unknown_provider_is_404(h):
    status, answer = await _post(h, BODY, webhooks.signed_headers(h.settings.fake_webhook_secret, BODY), "acme")
    assert status == 404
    assert_error(answer, "not_found")
    assert await _nothing_stored(h)


async def test_a_verified_delivery_is_stored_once_however_often_it_arrives(h):
    secret = h.settings.fake_webhook_secret
    msg_id = webhooks.new_message_id()
    # A provider's retries keep the webhook-id and re-sign with a fresh timestamp; some arrive together.
    deliveries = [webhooks.signed_headers(secret, BODY, msg_id=msg_id, timestamp=int(time.time()) - i)
                  for i in range(4)]

    first = await _post(h, BODY, deliveries[0])
    rest = await asyncio.gather(*(_post(h, BODY, d) for d in deliveries[1:]))

    assert first == (200, {"received": True, "duplicate": False})
    assert all(r == (200, {"received": True, "duplicate": True}) for r in rest), rest
    rows = await h.pool.fetch("SELECT provider, webhook_id, payload FROM webhook_inbox")
    assert [(r["provider"], r["webhook_id"], bytes(r["payload"])) for r in rows] == [("fake", msg_id, BODY)]


async def test_a_stored_delivery_is_announced_on_the_inbox_subject(h, nats_url):
    status, _ = await _post(h, BODY, webhooks.signed_headers(h.settings.fake_webhook_secret, BODY))
    assert status == 200
    inbox_id = await h.pool.fetchval("SELECT id FROM webhook_inbox")

    # The gateway's outbox relay publishes the event; read it as the poller's durable consumer would.
    nc = await nats.connect(nats_url)
    try:
        psub = await nc.jetstream().pull_subscribe(events.INBOX, durable="test-inbox", stream=bus.WORK_STREAM)
        [msg] = await psub.fetch(1, timeout=10)
        assert events.decode(msg.data) == InboxReceived(inbox_id=inbox_id, provider="fake")
        assert msg.headers["Nats-Msg-Id"].startswith("outbox-")
        await msg.ack()
    finally:
        await nc.close()

    async def relayed() -> bool:  # published, then removed from the outbox
        return await h.count("SELECT count(*) FROM outbox") == 0

    await wait_until(relayed, within=10, what="the outbox to be emptied")

