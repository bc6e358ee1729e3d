"""`GET /v1/account/usage` against a real gateway and database: the account's jobs grouped by model, UTC day and
a metadata key, each group's figures right; other accounts' jobs, deleted jobs and jobs outside the range
left out; and every bad parameter answered with a 4xx naming it."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest

from tests.gateway_harness import assert_error, drive, gateway_settings, running_gateway, store_outputs
from vidjobs.common.states import JobStatus
from vidjobs_client import AsyncClient

ESTIMATE = 50  # the harness's body: 5 s at 720p, 10 credits a second
DAY1, DAY2 = datetime(2026, 3, 1, 10, tzinfo=UTC), datetime(2026, 3, 2, 23, 59, tzinfo=UTC)
RANGE = {"from": "2026-03-01T00:00:00Z", "to": "2026-03-03T00:00:00+00:00"}


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def _job(h, key: str, *, model: str, created_at: datetime, metadata: dict[str, str] | None = None) -> str:
    status, body = await h.post_job(key, metadata=metadata or {})
    assert status == 201, body
    await h.pool.execute("UPDATE jobs SET model = $2, created_at = $3 WHERE id = $1", body["id"], model, created_at)
    return body["id"]


async def _usage(h, key: str, **params: str) -> tuple[int, dict]:
    return await h.get(key, "/v1/account/usage?" + urlencode(params))


@pytest.fixture
async def account(h):
    """An account with, in range: a delivered job, a failed one and a canceled one on day 1; a waiting one on
    day 2. Out of it: a deleted job, a job a day later, and another account's job."""
    account_id, key = await h.account(credits=10_000)
    delivered = await _job(h, key, model="fake/default", created_at=DAY1, metadata={"customer": "acme"})
    outputs = await store_outputs(h, account_id, delivered, video=b"\x00\x00\x00\x18ftypmp42" + bytes(512))
    await drive(h.pool, delivered, JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED, outputs=outputs)
    failed = await _job(h, key, model="fake/other", created_at=DAY1, metadata={"customer": "acme"})
    await drive(h.pool, failed, JobStatus.SUBMITTED, JobStatus.FAILED)
    canceled = await _job(h, key, model="fake/other", created_at=DAY1)
    await drive(h.pool, canceled, JobStatus.CANCELED)
    await _job(h, key, model="fake/default", created_at=DAY2, metadata={"customer": "zeta"})
    deleted = await _job(h, key, model="fake/default", created_at=DAY2, metadata={"customer": "acme"})
    assert (await h.client.delete(f"/v1/jobs/{deleted}", headers={"Authorization": f"Bearer {key}"})).status == 204
    await _job(h, key, model="fake/default", created_at=datetime(2026, 3, 3, tzinfo=UTC))
    _, other_key = await h.account(credits=10_000)
    await _job(h, other_key, model="fake/default", created_at=DAY1, metadata={"customer": "acme"})
    return key


def _groups(body: dict) -> dict:
    return {g["key"]: {k: v for k, v in g.items() if k != "key"} for g in body["data"]}


async def test_usage_groups_by_model(h, account):
    status, body = await _usage(h, account, group_by="model", **RANGE)

    assert status == 200, body
    assert (body["group_by"], body["from"], body["to"], body["truncated"]) == (
        "model", "2026-03-01T00:00:00Z", "2026-03-03T00:00:00Z", False)
    assert _groups(body) == {
        "fake/default": {"jobs": 2, "by_status": {"completed": 1, "pending": 1}, "credits_charged": ESTIMATE,
                         "credits_reserved": ESTIMATE, "seconds_delivered": 1.0},
        "fake/other": {"jobs": 2, "by_status": {"failed": 1, "canceled": 1}, "credits_charged": 0,
                       "credits_reserved": 0, "seconds_delivered": 0.0},
    }
    assert [g["key"] for g in body["data"]] == ["fake/default", "fake/other"]
    async with AsyncClient(str(h.client.make_url("")), account) as vj:
        seen = await vj.usage(group_by="model", start=datetime.fromisoformat(RANGE["from"]),
                              end=datetime.fromisoformat(RANGE["to"]))
    assert (seen.from_, [(g.key, g.jobs, g.credits_charged) for g in seen.data]) == (
        datetime(2026, 3, 1, tzinfo=UTC), [("fake/default", 2, ESTIMATE), ("fake/other", 2, 0)])


async def test_usage_groups_by_utc_day(h, account):
    status, body = await _usage(h, account, group_by="day", **RANGE)

    assert status == 200, body
    assert _groups(body) == {
        "2026-03-01": {"jobs": 3, "by_status": {"completed": 1, "failed": 1, "canceled": 1},
                       "credits_charged": ESTIMATE, "credits_reserved": 0, "seconds_delivered": 1.0},
        "2026-03-02": {"jobs": 1, "by_status": {"pending": 1}, "credits_charged": 0, "credits_reserved": ESTIMATE,
                       "seconds_delivered": 0.0},
    }


async def test_usage_groups_by_a_metadata_key_with_the_jobs_without_it_last(h, account):
    status, body = await _usage(h, account, group_by="metadata.customer", **RANGE)

    assert status == 200, body
    assert [g["key"] for g in body["data"]] == ["acme", "zeta", None]
    assert _groups(body) == {
        "acme": {"jobs": 2, "by_status": {"completed": 1, "failed": 1}, "credits_charged": ESTIMATE,
                 "credits_reserved": 0, "seconds_delivered": 1.0},
        "zeta": {"jobs": 1, "by_status": {"pending": 1}, "credits_charged": 0, "credits_reserved": ESTIMATE,
                 "seconds_delivered": 0.0},
        None: {"jobs": 1, "by_status": {"canceled": 1}, "credits_charged": 0, "credits_reserved": 0,
               "seconds_delivered": 0.0},
    }


async def test_usage_defaults_to_the_last_30_days_by_day(h):
    _, key = await h.account()
    status, made = await h.post_job(key)
    assert status == 201

    status, body = await _usage(h, key)

    assert status == 200, body
    assert body["group_by"] == "day"
    start, end = datetime.fromisoformat(body["from"]), datetime.fromisoformat(body["to"])
    assert (end - start).days == 30
    assert [(g["jobs"], g["credits_reserved"]) for g in body["data"]] == [(1, ESTIMATE)]


BAD = [
    ({"group_by": "status"}, 422, ("group_by", "metadata.<key>")),
    ({"group_by": "metadata."}, 422, ("group_by",)),
    ({"group_by": "metadata." + "k" * 41}, 422, ("group_by",)),
    ({"group_by": "metadata.two words"}, 422, ("group_by",)),
    ({"group_by": "metadata.key;drop"}, 422, ("group_by",)),
    ({"from": "yesterday"}, 422, ("from",)),
    ({"from": "2026-03-01T00:00:00"}, 422, ("from",)),  # no offset: which day is ambiguous
    ({"to": "2026-13-01T00:00:00Z"}, 422, ("to",)),
    ({"from": "2026-03-02T00:00:00Z", "to": "2026-03-01T00:00:00Z"}, 422, ("from", "before")),
    ({"from": "2025-01-01T00:00:00Z", "to": "2026-03-01T00:00:00Z"}, 422, ("from", "366 days")),
    ({"groupby": "model"}, 422, ("groupby",)),
]


async def test_usage_refuses_bad_parameters_with_a_4xx_naming_them(h):
    _, key = await h.account()
    for params, status, mentions in BAD:
        answered, body = await _usage(h, key, **params)

        assert answered == status, (params, body)
        assert_error(body, "invalid_input", *mentions)
        print(params, "->", body["error"]["message"])


async def test_usage_refuses_a_repeated_parameter_and_asks_for_a_key(h):
    _, key = await h.account()
    status, body = await h.get(key, "/v1/account/usage?group_by=day&group_by=model")
    assert status == 400
    assert_error(body, "invalid_input", "once")
    status, body = await h.get(None, "/v1/account/usage")
    assert status == 401
