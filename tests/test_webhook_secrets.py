"""The secrets that sign webhooks, through the API of a gateway over its own database: each is shown once, when
it is made; rotating one keeps the old one signing until the overlap asked for ends; the account's secret is
made on purpose (a job naming `webhook_url` without one is refused, saying how to make it); every bad input is
a clear 4xx; and what is stored is sealed under the gateway's first key, resealed when the key changes, and
refused at start when it was sealed under a key the gateway lacks."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from tests.gateway_harness import Harness, assert_error, auth, gateway_settings, running_gateway
from vidjobs.common import signatures
from vidjobs.common.errors import ConfigError, WebhookRejected
from vidjobs.gateway import sealing
from vidjobs.gateway.app import create_app
from vidjobs.gateway.appwebhooks import secrets
from vidjobs.gateway.sealing import Keyring
from vidjobs.gateway.state import GATEWAY

# A public address written out, so no name needs resolving; nothing there need answer.
HOOK = "https://93.184.215.14/hooks"
ACCOUNT_SECRET = "/v1/account/webhook-secret"


def test_a_delivery_signed_with_two_secrets_verifies_with_either_and_names_them_in_order():
    new, old, other = signatures.new_secret(), signatures.new_secret(), signatures.new_secret()
    body = b'{"type": "job.completed"}'

    headers = signatures.signed_headers([new, old], body, msg_id="msg_1")

    assert headers["webhook-signature"].split() == [signatures.sign(s, "msg_1", int(headers["webhook-timestamp"]), body)
                                                    for s in (new, old)]
    assert signatures.verify(new, headers, body) == signatures.verify(old, headers, body) == "msg_1"
    with pytest.raises(WebhookRejected):
        signatures.verify(other, headers, body)
    with pytest.raises(ConfigError):
        signatures.signed_headers([], body)


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def call(h: Harness, key: str, method: str, path: str, body: Any = None,
               content_type: str = "application/json") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {**auth(key), **({"Content-Type": content_type} if data is not None else {})}
    resp = await h.client.request(method, path, data=data, headers=headers)
    return resp.status, (await resp.json() if resp.content_type == "application/json" else await resp.text())


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def endpoint_of(h: Harness, key: str) -> dict:
    status, endpoint = await call(h, key, "POST", "/v1/webhook-endpoints", {"url": HOOK})
    assert status == 201, endpoint
    return endpoint


async def test_the_account_secret_is_shown_once_when_made_and_a_rotation_keeps_the_old_one_a_while(h):
    account_id, key = await h.account()

    before = await call(h, key, "GET", ACCOUNT_SECRET)
    made = await call(h, key, "POST", ACCOUNT_SECRET, {})
    seen = await call(h, key, "GET", ACCOUNT_SECRET)
    rotated = await call(h, key, "POST", ACCOUNT_SECRET)  # no body: the default overlap, a day
    rotated_seen = await call(h, key, "GET", ACCOUNT_SECRET)
    signing = await secrets.signing_secrets(h.gw.rt, account_id, None)
    at_once = await call(h, key, "POST", ACCOUNT_SECRET, {"overlap_s": 0})
    at_once_signing = await secrets.signing_secrets(h.gw.rt, account_id, None)

    assert before == (200, {"created_at": None, "previous_secret_expires_at": None})
    assert made[0] == 201 and made[1]["secret"].startswith("whsec_"), made
    assert made[1]["previous_secret_expires_at"] is None
    assert seen == (200, {"created_at": made[1]["created_at"], "previous_secret_expires_at": None})
    assert rotated[0] == 201 and rotated[1]["secret"] != made[1]["secret"]
    window = at(rotated[1]["previous_secret_expires_at"]) - at(rotated[1]["created_at"])
    assert abs(window - timedelta(days=1)) < timedelta(seconds=2)
    assert rotated_seen == (200, {k: rotated[1][k] for k in ("created_at", "previous_secret_expires_at")})
    assert "whsec_" not in json.dumps(rotated_seen[1])
    assert signing == [rotated[1]["secret"], made[1]["secret"]]
    assert at_once[0] == 201 and at_once[1]["previous_secret_expires_at"] is None
    assert at_once_signing == [at_once[1]["secret"]]


async def test_a_job_naming_webhook_url_needs_the_account_secret_made_first(h):
    _, key = await h.account()

    refused = await h.post_job(key, webhook_url=f"{HOOK}/own")
    estimate = await call(h, key, "POST", "/v1/estimates", {"model": "fake/default", "prompt": "x",
                                                            "webhook_url": f"{HOOK}/own"})
    jobs_after_refusal = await h.count("SELECT count(*) FROM jobs")
    assert (await call(h, key, "POST", ACCOUNT_SECRET, {}))[0] == 201
    accepted = await h.post_job(key, webhook_url=f"{HOOK}/own")

    assert refused[0] == 422, refused
    assert_error(refused[1], "invalid_input", "webhook_url", "POST /v1/account/webhook-secret")
    assert estimate[0] == 422 and "POST /v1/account/webhook-secret" in estimate[1]["error"]["message"]
    assert jobs_after_refusal == 0
    assert accepted[0] == 201, accepted


async def test_an_endpoint_secret_rotates_with_an_overlap_and_its_listing_says_until_when(h):
    account_id, key = await h.account()
    endpoint = await endpoint_of(h, key)

    rotated = await call(h, key, "POST", f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret", {"overlap_s": 3600})
    [listed] = (await call(h, key, "GET", "/v1/webhook-endpoints"))[1]["data"]
    signing = await secrets.signing_secrets(h.gw.rt, account_id, endpoint["id"])
    again = await call(h, key, "POST", f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret", {"overlap_s": 0})
    [listed_again] = (await call(h, key, "GET", "/v1/webhook-endpoints"))[1]["data"]
    signing_again = await secrets.signing_secrets(h.gw.rt, account_id, endpoint["id"])

    assert endpoint["secret_created_at"] == endpoint["created_at"] and endpoint["previous_secret_expires_at"] is None
    assert rotated[0] == 200, rotated
    assert set(rotated[1]) == {"secret", "created_at", "previous_secret_expires_at"}
    new = rotated[1]["secret"]
    assert new.startswith("whsec_") and new != endpoint["secret"]
    window = at(rotated[1]["previous_secret_expires_at"]) - at(rotated[1]["created_at"])
    assert abs(window - timedelta(hours=1)) < timedelta(seconds=2)
    assert "secret" not in listed and listed["secret_created_at"] == rotated[1]["created_at"]
    assert listed["previous_secret_expires_at"] == rotated[1]["previous_secret_expires_at"]
    assert signing == [new, endpoint["secret"]]
    assert again[0] == 200 and again[1]["previous_secret_expires_at"] is None
    assert listed_again["previous_secret_expires_at"] is None
    assert signing_again == [again[1]["secret"]]


BAD_BODIES = [
    (b'{"overlap_s": -1}', "application/json", 422, "overlap_s"),
    (b'{"overlap_s": 604801}', "application/json", 422, "overlap_s"),
    (b'{"overlap_s": "1h"}', "application/json", 422, "overlap_s"),
    (b'{"overlap_s": 1.5}', "application/json", 422, "overlap_s"),
    (b'{"overlap": 60}', "application/json", 422, "overlap"),
    (b'[60]', "application/json", 422, "object"),
    (b'{"overlap_s": ', "application/json", 400, "JSON"),
    (b'overlap_s=60', "application/x-www-form-urlencoded", 415, "application/json"),
]


@pytest.mark.parametrize(("body", "content_type", "status", "mention"), BAD_BODIES)
async def test_a_bad_rotation_is_refused_and_changes_nothing(h, body, content_type, status, mention):
    account_id, key = await h.account()
    endpoint = await endpoint_of(h, key)
    assert (await call(h, key, "POST", ACCOUNT_SECRET, {}))[0] == 201
    before = (await secrets.signing_secrets(h.gw.rt, account_id, endpoint["id"]),
              await secrets.signing_secrets(h.gw.rt, account_id, None))

    answers = [await call(h, key, "POST", path, body, content_type)
               for path in (f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret", ACCOUNT_SECRET)]

    for answer in answers:
        assert answer[0] == status, answer
        assert mention in answer[1]["error"]["message"], answer
    assert (await secrets.signing_secrets(h.gw.rt, account_id, endpoint["id"]),
            await secrets.signing_secrets(h.gw.rt, account_id, None)) == before


async def test_rotating_an_endpoint_that_is_not_there_is_404(h):
    _, key = await h.account()
    endpoint = await endpoint_of(h, key)
    assert (await call(h, key, "DELETE", f"/v1/webhook-endpoints/{endpoint['id']}"))[0] == 204

    for endpoint_id in (endpoint["id"], "whe_" + "0" * 26, "nope"):
        status, body = await call(h, key, "POST", f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret", {})
        assert status == 404, body
        assert_error(body, "not_found")


async def _key_ids_stored(h: Harness) -> set[str]:
    rows = await h.pool.fetch(
        "SELECT secret_sealed AS s FROM webhook_endpoints "
        "UNION ALL SELECT previous_secret_sealed FROM webhook_endpoints "
        "UNION ALL SELECT webhook_secret_sealed FROM accounts "
        "UNION ALL SELECT webhook_previous_secret_sealed FROM accounts")
    return {r["s"].split(".")[0] for r in rows if r["s"] is not None}


async def test_a_gateway_reseals_under_its_first_key_and_refuses_secrets_sealed_under_a_key_it_lacks(
        tmp_path, database_url, nats_url):
    key_a, key_b, key_c = sealing.new_key(), sealing.new_key(), sealing.new_key()
    id_a, id_b = Keyring.from_setting(key_a).primary_id, Keyring.from_setting(key_b).primary_id

    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url, secrets_key=key_a)) as first:
        account_id, key = await first.account()
        endpoint = await endpoint_of(first, key)
        _, made = await call(first, key, "POST", ACCOUNT_SECRET, {})
        _, rotated = await call(first, key, "POST", f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret", {})
        under_a = await _key_ids_stored(first)
    # The key itself rotated: B seals, A still opens.
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url,
                                                secrets_key=f"{key_b},{key_a}")) as second:
        under_b = await _key_ids_stored(second)
        signing = (await secrets.signing_secrets(second.gw.rt, account_id, endpoint["id"]),
                   await secrets.signing_secrets(second.gw.rt, account_id, None))
    before = asyncio.all_tasks()
    app = create_app(gateway_settings(tmp_path, database_url, nats_url, secrets_key=key_c))
    runner = web.AppRunner(app)
    try:
        with pytest.raises(ConfigError) as refused:
            await runner.setup()  # where the gateway opens what it holds, before it listens
    finally:
        await runner.cleanup()
    left = asyncio.all_tasks() - before
    rt = app[GATEWAY].rt  # made before the check that refused the start

    assert under_a == {id_a} and under_b == {id_b}
    assert signing == ([rotated["secret"], endpoint["secret"]], [made["secret"]])
    assert id_b in str(refused.value) and "VIDJOBS_SECRETS_KEY" in str(refused.value)
    # A refused start releases everything it opened, and stopping what it had started is no failure.
    assert not left, f"tasks the refused start left running: {left}"
    assert rt.stop.is_set() and rt.failure is None
    assert all(task.done() for task in rt.tasks)
    assert rt.pool.is_closing() and rt.nc.is_closed
    assert app[GATEWAY].routes._listener is None
