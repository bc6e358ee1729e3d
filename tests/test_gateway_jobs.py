"""`/v1/jobs` and `/v1/account` against a real gateway, database and NATS: creation, validation, credit,
idempotency, listing, cancel, delete and the audit trail."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.gateway_harness import JOB_BODY, assert_error, auth, drive, gateway_settings, running_gateway
from vidjobs.common.states import JobStatus

# Every field docs/API.md names, plus `queue_reason` (why a queued job waits), `priority` (its lane), `estimate`
# (when a waiting job is likely to start and be ready), `ready` (when a rendering one is likely to be ready) and
# `retry` (what sent a retried job round again), added in the same style.
API_JOB_KEYS = {"id", "status", "stage", "model", "prompt", "created_at", "updated_at", "attempt", "retry",
                "queue_position", "queue_reason", "priority", "estimate", "ready", "progress", "error", "outputs",
                "cost",
                # beside what docs/API.md names: the request echoed, the job's times, links and metadata
                "duration_s", "aspect_ratio", "resolution", "seed", "negative_prompt", "input_image", "params",
                "metadata", "fallback_models", "max_wait_s", "started_at", "completed_at", "deadline_at", "retry_at",
                "rerun_of",
                "urls"}


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def test_create_answers_201_with_the_job_and_reserves_its_credit(h):
    account_id, key = await h.account(credits=1000)

    status, job = await h.post_job(key)

    assert status == 201, job
    assert set(job) == API_JOB_KEYS
    assert job["id"].startswith("job_") and job["status"] == "pending" and job["stage"] == "queued"
    assert job["model"] == "fake/default" and job["prompt"] == JOB_BODY["prompt"] and job["attempt"] == 1
    assert job["outputs"] is None and job["error"] is None
    assert job["queue_position"] == 1  # the account's only waiting job
    assert job["priority"] == "interactive"  # the default lane
    assert job["cost"] == {"estimated_credits": 50, "actual_credits": None, "provider_credits": None,
                           "absorbed_credits": None}
    assert job["created_at"].endswith("Z")
    status, account = await h.get(key, "/v1/account")
    assert status == 200
    assert account == {
        "id": account_id, "name": account["name"], "credits": {"balance": 1000, "reserved": 50, "available": 950},
        "limits": {"concurrent_jobs": 2, "daily_spend_cap": None, "max_job_credits": None,
                   "requests_per_s": h.settings.api_rate_per_s, "request_burst": h.settings.api_rate_burst,
                   "max_queued_jobs": h.settings.max_queued_jobs,
                   "max_open_streams": h.settings.max_streams_per_account,
                   "max_open_streams_per_key": h.settings.max_streams_per_key,
                   "max_uploads_per_day": h.settings.max_uploads_per_day,
                   "max_body_bytes": h.settings.max_body_bytes, "max_upload_bytes": h.settings.upload_max_bytes,
                   "max_webhook_endpoints": h.settings.max_webhook_endpoints,
                   "webhook_deliveries_in_flight": h.settings.webhook_deliveries_in_flight,
                   "webhook_deliveries_per_minute": h.settings.webhook_deliveries_per_minute,
                   "max_webhook_manual_retries": h.settings.max_webhook_manual_retries,
                   "max_exports_in_flight": h.settings.max_exports_in_flight},
        "spent_today": 50, "active_jobs": 1, "queued_jobs": 1, "uploads_today": 0,
        "fallback_models": [],
        "storage": {"used_bytes": 0, "limit_bytes": h.settings.storage_quota_bytes, "kept_jobs": 0}}
    status, same = await h.get(key, f"/v1/jobs/{job['id']}")
    assert status == 200 and same == job


async def test_1080p_costs_more(h):
    key = await h.key()
    _, job = await h.post_job(key, resolution="1080p", duration_s=4)
    assert job["cost"]["estimated_credits"] == 60


@pytest.mark.parametrize(("changes", "status", "field"), [
    ({"model": "fake"}, 422, "model"),
    ({"model": "nope/default"}, 422, "model"),
    ({"prompt": ""}, 422, "prompt"),
    ({"prompt": "   "}, 422, "prompt"),
    ({"prompt": "x" * 2001}, 422, "prompt"),
    ({"duration_s": 0}, 422, "duration_s"),
    ({"duration_s": 61}, 422, "duration_s"),
    ({"duration_s": "5"}, 422, "duration_s"),
    ({"aspect_ratio": "2:1"}, 422, "aspect_ratio"),
    ({"resolution": "4k"}, 422, "resolution"),
    ({"priority": "urgent"}, 422, "priority"),
    ({"seed": -1}, 422, "seed"),
    ({"negative_prompt": 3}, 422, "negative_prompt"),
    ({"input_image": "http://example.com/cat.png"}, 422, "input_image"),
    ({"input_image": "upl_doesnotexist"}, 422, "input_image"),
    ({"params": []}, 422, "params"),
    ({"colour": "red"}, 422, "colour"),
])
async def test_every_validation_error_names_its_field_and_creates_nothing(h, changes, status, field):
    key = await h.key()
    code, body = await h.post_job(key, **changes)
    assert code == status, body
    assert_error(body, "invalid_input", field)
    assert await h.count("SELECT count(*) FROM jobs") == 0
    assert await h.count("SELECT count(*) FROM outbox") == 0
    assert await h.count("SELECT sum(credits_reserved) FROM accounts") == 0


@pytest.mark.parametrize("body", [{"prompt": "a fox"}, {"model": "fake/default"}])
async def test_missing_required_fields_are_named(h, body):
    code, resp = await h.post_job(await h.key(), body)
    assert code == 422
    assert_error(resp, "invalid_input", "model" if "model" not in body else "prompt")


@pytest.mark.parametrize("raw", [b"{", b"not json", b""])
async def test_a_body_that_is_not_json_is_400(h, raw):
    code, body = await h.post_job(await h.key(), raw)
    assert code == 400
    assert_error(body, "invalid_input", "JSON")
    assert await h.count("SELECT count(*) FROM jobs") == 0


async def test_a_json_body_of_the_wrong_shape_is_422(h):
    code, body = await h.post_job(await h.key(), [JOB_BODY])
    assert code == 422
    assert_error(body, "invalid_input", "object")


async def test_provider_specific_params_are_checked_by_the_adapter(h):
    code, body = await h.post_job(await h.key(), params={"scenario": "no_such_scenario"})
    assert code == 422, body
    assert_error(body, "invalid_input", "scenario")
    assert await h.count("SELECT count(*) FROM jobs") == 0


async def test_wrong_content_type_is_415(h):
    resp = await h.client.post("/v1/jobs", data=json.dumps(JOB_BODY),
                               headers={**auth(await h.key()), "Content-Type": "text/plain"})
    assert resp.status == 415
    assert_error(await resp.json(), "unsupported_media_type")


async def test_a_body_over_the_limit_is_413_with_or_without_a_length(h):
    key = await h.key()
    big = json.dumps({**JOB_BODY, "params": {"pad": "x" * h.settings.max_body_bytes}}).encode()
    resp = await h.client.post("/v1/jobs", data=big, headers={**auth(key), "Content-Type": "application/json"})
    assert resp.status == 413
    assert_error(await resp.json(), "payload_too_large")

    async def chunks():
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    resp = await h.client.post("/v1/jobs", data=chunks(), headers={**auth(key), "Content-Type": "application/json"})
    assert resp.status == 413
    assert_error(await resp.json(), "payload_too_large")
    assert await h.count("SELECT count(*) FROM jobs") == 0


async def test_no_credit_is_402_and_creates_nothing(h):
    key = await h.key(credits=90)

    first, _ = await h.post_job(key, duration_s=5)  # 50 of 90
    second, body = await h.post_job(key, duration_s=5)  # 50 more than the 40 left
    third, _ = await h.post_job(key, duration_s=4)  # exactly the 40 left

    assert (first, second, third) == (201, 402, 201)
    assert_error(body, "quota_exhausted", "credit")
    assert await h.count("SELECT count(*) FROM jobs") == 2
    assert await h.count("SELECT credits_reserved FROM accounts") == 90


async def test_same_idempotency_key_and_body_answer_the_same_job(h):
    key = await h.key()
    headers = {"Idempotency-Key": "order-42"}

    first, job = await h.post_job(key, headers=headers)
    # The same request with keys reordered and a default spelled out is the same request.
    reordered = {k: JOB_BODY[k] for k in reversed(list(JOB_BODY))}
    again, same = await h.post_job(key, reordered, headers=headers)

    assert (first, again) == (201, 200)
    assert same["id"] == job["id"]
    assert await h.count("SELECT count(*) FROM jobs") == 1
    assert await h.count("SELECT credits_reserved FROM accounts") == 50


async def test_same_idempotency_key_with_another_body_is_409(h):
    key = await h.key()
    await h.post_job(key, headers={"Idempotency-Key": "k1"})
    status, body = await h.post_job(key, headers={"Idempotency-Key": "k1"}, prompt="something else")
    assert status == 409
    assert_error(body, "conflict", "Idempotency-Key")
    assert await h.count("SELECT count(*) FROM jobs") == 1


async def test_idempotency_keys_belong_to_one_account(h):
    one, two = await h.key(), await h.key()
    _, a = await h.post_job(one, headers={"Idempotency-Key": "shared"})
    status, b = await h.post_job(two, headers={"Idempotency-Key": "shared"})
    assert status == 201 and b["id"] != a["id"]


async def test_concurrent_requests_with_one_key_make_one_job(h):
    key = await h.key()
    results = await asyncio.gather(*(h.post_job(key, headers={"Idempotency-Key": "race"}) for _ in range(8)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 7 + [201], results
    assert len({job["id"] for _, job in results}) == 1
    assert await h.count("SELECT count(*) FROM jobs") == 1
    assert await h.count("SELECT credits_reserved FROM accounts") == 50


async def test_a_malformed_idempotency_key_is_400(h):
    status, body = await h.post_job(await h.key(), headers={"Idempotency-Key": "x" * 300})
    assert status == 400
    assert_error(body, "invalid_input", "Idempotency-Key")


async def test_list_pages_newest_first_without_gaps_or_repeats(h):
    key = await h.key()
    made = [(await h.post_job(key, prompt=f"clip {i}"))[1]["id"] for i in range(5)]

    seen, cursor = [], None
    while True:
        path = "/v1/jobs?limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, page = await h.get(key, path)
        assert status == 200 and len(page["data"]) <= 2
        seen += [job["id"] for job in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == list(reversed(made))


async def test_list_filters_by_status(h):
    key = await h.key()
    ids = [(await h.post_job(key))[1]["id"] for _ in range(3)]
    await h.client.post(f"/v1/jobs/{ids[1]}/cancel", headers=auth(key))

    _, canceled = await h.get(key, "/v1/jobs?status=canceled")
    _, pending = await h.get(key, "/v1/jobs?status=pending&limit=100")

    assert [j["id"] for j in canceled["data"]] == [ids[1]]
    assert [j["id"] for j in pending["data"]] == [ids[2], ids[0]]
    assert canceled["next_cursor"] is None


@pytest.mark.parametrize(("query", "status", "name"), [
    ("limit=0", 422, "limit"),
    ("limit=101", 422, "limit"),
    ("limit=ten", 422, "limit"),
    ("status=lost", 422, "status"),
    ("cursor=%%%", 400, "cursor"),
    ("cursor=bm90IGEgY3Vyc29y", 400, "cursor"),
    ("colour=red", 422, "colour"),
])
async def test_bad_list_parameters_are_named(h, query, status, name):
    code, body = await h.get(await h.key(), f"/v1/jobs?{query}")
    assert code == status, body
    assert_error(body, "invalid_input", name)


async def test_cancel_moves_a_live_job_to_canceled_once(h):
    key = await h.key()
    _, job = await h.post_job(key)

    first = await h.client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    canceled = await first.json()
    again = await (await h.client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))).json()

    assert first.status == 200
    assert canceled["status"] == "canceled" and canceled["stage"] == "canceled"
    assert canceled["error"] == {"code": "canceled", "message": canceled["error"]["message"], "retryable": False}
    assert again == canceled
    _, trail = await h.get(key, f"/v1/jobs/{job['id']}/events")
    assert [(m["from"], m["to"], m["reason"]) for m in trail["data"]] == [
        (None, "pending", "created"), ("pending", "canceled", "canceled by owner")]


async def test_cancel_of_a_finished_job_leaves_it_unchanged(h):
    key = await h.key()
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.FAILED)

    resp = await h.client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))

    assert resp.status == 200
    assert (await resp.json())["status"] == "failed"
    assert await h.count("SELECT count(*) FROM job_transitions WHERE to_status = 'canceled'") == 0


async def test_events_is_the_audit_trail(h):
    key = await h.key()
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, JobStatus.PROCESSING)

    status, trail = await h.get(key, f"/v1/jobs/{job['id']}/events")

    assert status == 200
    moves = trail["data"]
    assert [(m["from"], m["to"]) for m in moves] == [(None, "pending"), ("pending", "submitted"),
                                                     ("submitted", "processing")]
    assert all(set(m) == {"from", "to", "stage", "at", "reason"} and m["at"].endswith("Z") for m in moves)
    assert [m["stage"] for m in moves] == ["queued", "submitted", "rendering"]
    _, now = await h.get(key, f"/v1/jobs/{job['id']}")
    assert now["status"] == "processing" and now["stage"] == "rendering"


async def test_a_deleted_job_is_gone_from_every_read(h):
    key = await h.key()
    _, job = await h.post_job(key)
    path = f"/v1/jobs/{job['id']}"

    resp = await h.client.delete(path, headers=auth(key))

    assert resp.status == 204
    for method, url in [("GET", path), ("POST", f"{path}/cancel"), ("GET", f"{path}/events"),
                        ("GET", f"{path}/stream"), ("DELETE", path)]:
        resp = await h.client.request(method, url, headers=auth(key))
        assert resp.status == 404, (method, url)
        assert_error(await resp.json(), "not_found")
    _, listed = await h.get(key, "/v1/jobs")
    assert listed["data"] == []
    _, account = await h.get(key, "/v1/account")
    assert account["active_jobs"] == 0


async def test_unknown_job_is_404(h):
    key = await h.key()
    for job_id in ["job_nope", "x" * 500]:
        status, body = await h.get(key, f"/v1/jobs/{job_id}")
        assert status == 404
        assert_error(body, "not_found")


async def test_racing_creates_never_queue_past_the_accounts_cap(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url, max_queued_jobs=3)) as h:
        account_id, key = await h.account()
        _, other = await h.account()

        answers = await asyncio.gather(*(h.post_job(key, prompt=f"race {i}") for i in range(12)))

        statuses = sorted(status for status, _ in answers)
        assert statuses == [201] * 3 + [429] * 9, statuses
        refused = next(body for status, body in answers if status == 429)
        assert_error(refused, "limit_reached", "3 jobs waiting", "cancel")
        assert refused["error"]["retryable"] is True
        assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account_id) == 3
        # A refused create reserved nothing; another account's queue is its own.
        assert await h.count("SELECT credits_reserved FROM accounts WHERE id = $1", account_id) == 3 * 50
        assert (await h.post_job(other))[0] == 201
        # A job that starts frees its place.
        first = next(body for status, body in answers if status == 201)
        await drive(h.pool, first["id"], JobStatus.SUBMITTED)
        assert (await h.post_job(key))[0] == 201
        _, account = await h.get(key, "/v1/account")
        assert account["limits"]["max_queued_jobs"] == 3 and account["queued_jobs"] == 3
