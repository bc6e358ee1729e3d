"""The job as an app developer reads it and finds it: the request echoed, its times, its links and its
metadata; and the listing's filters (several statuses, model, a creation window, metadata) with `has_more`,
each served by an index."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from tests.gateway_harness import JOB_BODY, assert_error, drive, gateway_settings, running_gateway
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate
from vidjobs.gateway.tenant import JobFilter, page_sql


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def test_the_job_echoes_its_request_and_shows_its_times_links_and_metadata(h):
    key = await h.key()
    body = {**JOB_BODY, "duration_s": 4, "aspect_ratio": "9:16", "resolution": "1080p", "seed": 11,
            "negative_prompt": "blur", "params": {"render_s": 0.5}, "metadata": {"order": "A-17", "user.id": "u_9"}}
    status, created = await h.post_job(key, body)
    deadline = datetime.now(UTC) + timedelta(minutes=10)
    await drive(h.pool, created["id"], JobStatus.SUBMITTED,
                update=JobUpdate(provider_job_id="r1", submitted_at=datetime.now(UTC), deadline_at=deadline))
    _, submitted = await h.get(key, f"/v1/jobs/{created['id']}")
    await drive(h.pool, created["id"], JobStatus.FAILED)
    _, failed = await h.get(key, f"/v1/jobs/{created['id']}")

    assert status == 201
    for name in ("duration_s", "aspect_ratio", "resolution", "seed", "negative_prompt", "input_image", "params",
                 "metadata"):
        assert created[name] == body[name], name
    own = f"/v1/jobs/{created['id']}"
    assert created["urls"] == {"get": own, "cancel": f"{own}/cancel", "stream": f"{own}/stream"}
    assert created["started_at"] is None and created["completed_at"] is None
    assert submitted["started_at"] is not None and submitted["completed_at"] is None
    assert datetime.fromisoformat(submitted["deadline_at"]) == deadline.replace(microsecond=deadline.microsecond)
    assert failed["completed_at"] is not None and failed["deadline_at"] is None
    assert failed["metadata"] == body["metadata"]


@pytest.mark.parametrize(("metadata", "named"), [
    ({f"k{i}": "v" for i in range(17)}, "metadata"),
    ({"has space": "v"}, "metadata"),
    ({"k": "x" * 257}, "metadata"),
    ({"k": 5}, "metadata"),
    (["not", "a", "map"], "metadata"),
])
async def test_bad_metadata_is_refused_naming_it_and_creates_nothing(h, metadata, named):
    key = await h.key()
    status, body = await h.post_job(key, {**JOB_BODY, "metadata": metadata})

    assert status == 422
    assert_error(body, "invalid_input", named)
    assert await h.count("SELECT count(*) FROM jobs") == 0


async def _ids(h, key: str, query: str) -> tuple[list[str], dict]:
    status, page = await h.get(key, f"/v1/jobs?{query}")
    assert status == 200, page
    return [j["id"] for j in page["data"]], page


async def test_the_listing_filters_by_status_model_time_and_metadata(h):
    key, other = await h.key(), await h.key()
    _, tagged = await h.post_job(key, metadata={"campaign": "spring"})
    _, polled = await h.post_job(key, model="fake-poll/default", metadata={"campaign": "autumn"})
    _, failed = await h.post_job(key)
    await drive(h.pool, failed["id"], JobStatus.FAILED)
    _, canceled = await h.post_job(key)
    await drive(h.pool, canceled["id"], JobStatus.CANCELED)
    _, theirs = await h.post_job(other, metadata={"campaign": "spring"})
    middle = datetime.fromisoformat(failed["created_at"])

    assert (await _ids(h, key, "status=failed,canceled"))[0] == [canceled["id"], failed["id"]]
    assert (await _ids(h, key, "status=pending"))[0] == [polled["id"], tagged["id"]]
    assert (await _ids(h, key, "model=fake-poll/default"))[0] == [polled["id"]]
    assert (await _ids(h, key, "metadata.campaign=spring"))[0] == [tagged["id"]]
    assert (await _ids(h, other, "metadata.campaign=spring"))[0] == [theirs["id"]]
    assert (await _ids(h, key, "metadata.campaign=spring&status=failed"))[0] == []
    window = f"created_after={middle.isoformat().replace('+', '%2B')}"
    assert (await _ids(h, key, window))[0] == [canceled["id"], failed["id"]]
    before = f"created_before={middle.isoformat().replace('+', '%2B')}"
    assert (await _ids(h, key, before))[0] == [polled["id"], tagged["id"]]

    first, page = await _ids(h, key, "limit=3")
    rest, last = await _ids(h, key, f"limit=3&cursor={page['next_cursor']}")
    assert (len(first), page["has_more"], len(rest), last["has_more"], last["next_cursor"]) == (3, True, 1, False, None)

    status, bad = await h.get(key, "/v1/jobs?status=done,failed")
    assert status == 422
    assert_error(bad, "invalid_input", "status")
    status, bad = await h.get(key, "/v1/jobs?metadata.has%20space=x")
    assert status == 422
    assert_error(bad, "invalid_input", "metadata")


async def test_each_filter_is_served_by_its_index(h):
    """With enough finished jobs in the table for the planner to care, each filter's plan reads an index made
    for it, never the whole table."""
    account_id, _ = await h.account()
    await h.pool.execute(
        """
        INSERT INTO jobs (id, account_id, model, provider, request, status, created_at, updated_at, metadata)
        SELECT 'job_f' || i, $1, CASE WHEN i % 50 = 0 THEN 'fake-poll/default' ELSE 'fake/default' END, 'fake',
               '{"model": "fake/default", "prompt": "p"}', (CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'completed'
               END)::job_status, now() - make_interval(secs => i), now(),
               CASE WHEN i % 200 = 0 THEN jsonb_build_object('campaign', 'c' || i) ELSE '{}' END
        FROM generate_series(1, 20000) i
        """, account_id)
    await h.pool.execute("ANALYZE jobs")
    async def plan(**wanted) -> str:
        sql, values = page_sql(JobFilter(**wanted), None)
        raw = await h.pool.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", account_id, 21, *values)
        return msgspec.json.encode(msgspec.json.decode(raw)).decode()

    by_status = await plan(statuses=[JobStatus.FAILED])
    by_model = await plan(model="fake-poll/default")
    by_metadata = await plan(metadata={"campaign": "c400"})
    assert "jobs_account_status_listing" in by_status, by_status
    assert "jobs_account_model_listing" in by_model, by_model
    assert "jobs_metadata" in by_metadata, by_metadata
    for found in (by_status, by_model, by_metadata):
        assert '"Seq Scan"' not in found


async def test_a_nul_character_anywhere_is_refused_naming_where(h):
    """PostgreSQL text cannot hold NUL: it is refused at the edge with the field named, never a 500."""
    key = await h.key()
    prompt_status, prompt = await h.post_job(key, prompt="a fox\u0000")
    label_status, label = await h.post_job(key, metadata={"k": "v\u0000"})
    params_status, params = await h.post_job(key, params={"note": ["x\u0000"]})
    query_status, query = await h.get(key, "/v1/jobs?model=fake/default%00")
    filter_status, filtered = await h.get(key, "/v1/jobs?metadata.k=%00")

    assert (prompt_status, label_status, params_status, query_status, filter_status) == (422, 422, 422, 400, 400)
    assert_error(prompt, "invalid_input", "prompt", "NUL")
    assert_error(label, "invalid_input", "metadata.k", "NUL")
    assert_error(params, "invalid_input", "params.note[0]", "NUL")
    assert_error(query, "invalid_input", "model", "NUL")
    assert_error(filtered, "invalid_input", "metadata.k", "NUL")
    assert await h.count("SELECT count(*) FROM jobs") == 0
