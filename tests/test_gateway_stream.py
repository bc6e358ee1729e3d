"""The SSE stream: the job on connect, a new event after each real transition (published by the outbox relay
as JobChanged), closed after a terminal state or deletion, and no subscription left behind."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway_harness import assert_error, auth, drive, gateway_settings, read_event, running_gateway
from tests.support import wait_until
from vidjobs.common import changes, deletion, events
from vidjobs.common.states import JobStatus
from vidjobs.gateway import stream


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


def change_subscriptions(h) -> list[str]:
    """The subjects the gateway listens on for change hints: one for every job, whatever its streams follow."""
    return [sub.subject for sub in h.gw.rt.nc._subs.values() if sub.subject.startswith(events.CHANGED_PREFIX)]


EVERY_JOB = [f"{events.CHANGED_PREFIX}.*"]


async def _open(h, key: str, job_id: str):
    resp = await h.client.get(f"/v1/jobs/{job_id}/stream", headers=auth(key))
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    return resp


async def test_stream_sends_the_job_then_each_change_and_closes_when_terminal(h):
    key = await h.key()
    _, job = await h.post_job(key)
    resp = await _open(h, key, job["id"])

    assert await read_event(resp) == ("job", job)

    await drive(h.pool, job["id"], JobStatus.SUBMITTED)
    name, submitted = await asyncio.wait_for(read_event(resp), 10)
    assert (name, submitted["status"], submitted["stage"]) == ("job", "submitted", "submitted")

    await drive(h.pool, job["id"], JobStatus.PROCESSING)
    _, rendering = await asyncio.wait_for(read_event(resp), 10)
    assert rendering["stage"] == "rendering"

    await h.client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    _, canceled = await asyncio.wait_for(read_event(resp), 10)
    assert canceled["status"] == "canceled"
    assert await asyncio.wait_for(read_event(resp), 10) is None  # the server closed the stream


async def test_a_finished_job_is_sent_once_and_the_stream_closes(h):
    key = await h.key()
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.FAILED)
    resp = await _open(h, key, job["id"])
    _, sent = await read_event(resp)
    assert sent["status"] == "failed"
    assert await asyncio.wait_for(read_event(resp), 10) is None


async def test_deleting_the_job_closes_its_stream(h):
    account_id, key = await h.account()
    _, job = await h.post_job(key)
    resp = await _open(h, key, job["id"])
    await read_event(resp)

    # As Tenant.delete does it: the change hints go out once the deletion commits.
    async with changes.after_commit(), h.pool.acquire() as conn, conn.transaction():
        await deletion.soft_delete(conn, job["id"], account_id)
    h.gw.rt.relay.poke()

    assert await asyncio.wait_for(read_event(resp), 10) is None


async def test_unknown_job_is_a_json_404_not_a_stream(h):
    resp = await h.client.get("/v1/jobs/job_nope/stream", headers=auth(await h.key()))
    assert resp.status == 404
    assert_error(await resp.json(), "not_found")
    assert h.gw.feeds.followed() == set()  # the feed made before the read is gone
    assert change_subscriptions(h) == EVERY_JOB


async def test_a_client_that_leaves_leaves_nothing_followed(h, monkeypatch):
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.2)
    key = await h.key()
    _, job = await h.post_job(key)
    resp = await _open(h, key, job["id"])
    _, first = await read_event(resp)
    assert first["status"] == "pending" and h.gw.feeds.followed() == {job["id"]}

    resp.close()

    async def forgotten() -> bool:
        return h.gw.feeds.followed() == set()

    await wait_until(forgotten, within=10, what="the stream's job to be followed no more")
    assert change_subscriptions(h) == EVERY_JOB


async def test_quiet_streams_send_keepalives(h, monkeypatch):
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.2)
    key = await h.key()
    _, job = await h.post_job(key)
    resp = await _open(h, key, job["id"])
    await read_event(resp)
    assert await asyncio.wait_for(resp.content.readline(), 5) == b": keepalive\n"


async def test_an_id_that_is_not_a_job_id_never_becomes_a_subject(h):
    key = await h.key()
    for job_id in ["job_*", "job_>", "job_a.b"]:
        resp = await h.client.get(f"/v1/jobs/{job_id}/stream", headers=auth(key))
        assert resp.status == 404, job_id
    assert change_subscriptions(h) == EVERY_JOB and h.gw.feeds.followed() == set()


async def test_a_browser_token_in_access_token_opens_its_jobs_stream_and_nothing_more(h):
    """EventSource cannot send a header: a browser token may come as `access_token` on a GET, and the route
    then reads its query without it. An API key may not, nor may a token on any other method."""
    key = await h.key()
    _, job = await h.post_job(key)
    resp = await h.client.post("/v1/account/tokens", json={"scopes": ["read"], "ttl_s": 60}, headers=auth(key))
    token = (await resp.json())["token"]

    resp = await h.client.get(f"/v1/jobs/{job['id']}/stream", params={"access_token": token})
    assert resp.status == 200 and await read_event(resp) == ("job", job)
    resp.close()
    resp = await h.client.get("/v1/jobs", params={"limit": "1", "access_token": token})
    assert resp.status == 200 and [j["id"] for j in (await resp.json())["data"]] == [job["id"]]

    resp = await h.client.get(f"/v1/jobs/{job['id']}", params={"access_token": key})
    assert resp.status == 401
    assert_error(await resp.json(), "unauthorized", "access_token")
    resp = await h.client.post(f"/v1/jobs/{job['id']}/cancel", params={"access_token": token})
    assert resp.status == 401
