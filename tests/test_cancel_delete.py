"""Cancel and delete at every stage, through the whole stack: the job ends (or vanishes) at once, the
provider is asked to stop, no worker moves it afterwards, and a deleted job's files are removed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.stack import Stack, running_stack, stack_settings
from tests.support import wait_until


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1,
                          retry_base_s=5, retry_cap_s=5)


async def _cancel(stack: Stack, job_id: str) -> dict:
    async with stack.session.post(f"{stack.url}/v1/jobs/{job_id}/cancel", headers=stack.auth) as resp:
        assert resp.status == 200
        return await resp.json()


async def _delete(stack: Stack, job_id: str) -> None:
    async with stack.session.delete(f"{stack.url}/v1/jobs/{job_id}", headers=stack.auth) as resp:
        assert resp.status == 204


async def _render_status(stack: Stack, job_id: str) -> str | None:
    async with stack.session.get(f"{stack.settings.fake_provider_url}/v1/renders", params={"job_id": job_id}) as r:
        renders = (await r.json())["data"]
    return renders[-1]["status"] if renders else None


async def _still_after(stack: Stack, job_id: str, seconds: float = 2.5) -> dict:
    """The job after workers have had time to act on any message still in flight for it."""
    await asyncio.sleep(seconds)
    return await stack.job(job_id)


async def test_cancel_while_queued_never_reaches_the_provider(settings):
    async with running_stack(settings) as stack:
        await stack.supervisor.stop("submitter")
        job = await stack.create_job(params={"render_s": 0.2})
        canceled = await _cancel(stack, job["id"])
        await stack.supervisor.start("submitter")
        later = await _still_after(stack, job["id"])
        counters = await stack.counters()

    assert canceled["status"] == "canceled" and canceled["error"]["code"] == "canceled"
    assert later["status"] == "canceled"
    assert job["id"] not in counters["submissions_by_job"]


async def test_cancel_while_retrying_stops_the_retries(settings):
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "unavailable_then_succeed", "render_s": 0.2})
        await stack.wait_for_status(job["id"], "retrying")
        await _cancel(stack, job["id"])
        # Full jitter may have let a second try out before the cancel; none may follow it.
        at_cancel = (await stack.counters())["submissions_by_job"][job["id"]]
        later = await _still_after(stack, job["id"], 6)  # past the 5 s backoff
        counters = await stack.counters()

    assert later["status"] == "canceled"
    assert counters["submissions_by_job"][job["id"]] == at_cancel
    assert job["id"] not in counters["renders_by_job"]


async def test_cancel_while_rendering_stops_the_render_at_the_provider(settings):
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "hang"})
        await stack.wait_for_status(job["id"], "processing")
        canceled = await _cancel(stack, job["id"])
        await wait_until(lambda: _is(stack, job["id"], "canceled"), within=15, what="the provider to stop")
        later = await _still_after(stack, job["id"])

    assert canceled["status"] == "canceled" and later["status"] == "canceled"


async def test_cancel_while_downloading_keeps_no_files(settings):
    async with running_stack(settings) as stack:
        await stack.supervisor.stop("media")
        job = await stack.create_job(params={"render_s": 0.1})
        await stack.wait_for_status(job["id"], "downloading")
        await _cancel(stack, job["id"])
        await stack.supervisor.start("media")
        later = await _still_after(stack, job["id"])
        objects = _objects(stack, job["id"])

    assert later["status"] == "canceled" and later["outputs"] is None
    assert objects == []


async def test_canceling_a_finished_job_changes_nothing(settings):
    async with running_stack(settings) as stack:
        job = await stack.wait_terminal((await stack.create_job(params={"render_s": 0.1}))["id"])
        answer = await _cancel(stack, job["id"])

    assert answer["status"] == "completed" and answer["outputs"]["sha256"] == job["outputs"]["sha256"]


@pytest.mark.parametrize("stage", ["queued", "rendering", "downloading", "ready"])
async def test_delete_at_any_stage_hides_the_job_and_removes_its_files(settings, stage):
    async with running_stack(settings) as stack:
        job_id = await _job_at(stack, stage)
        await _delete(stack, job_id)

        async with stack.session.get(f"{stack.url}/v1/jobs/{job_id}", headers=stack.auth) as resp:
            assert resp.status == 404
        await _restart_paused_workers(stack)
        await asyncio.sleep(2.5)
        await wait_until(lambda: _no_objects(stack, job_id), within=15, what="the job's files to be removed")
        row = await _row(stack, job_id)
        render = await _render_status(stack, job_id)

    assert row["deleted_at"] is not None
    # Deletion is not a status: a live job is canceled on the way (its trail says why), a finished one keeps
    # its status, and nothing moves either after.
    if stage == "ready":
        assert row["status"] == "completed" and row["last_reason"] != "deleted"
    else:
        assert (row["status"], row["last_reason"]) == ("canceled", "deleted")
    if stage == "rendering":
        assert render == "canceled"


async def _job_at(stack: Stack, stage: str) -> str:
    match stage:
        case "queued":
            await stack.supervisor.stop("submitter")
            return (await stack.create_job(params={"render_s": 0.1}))["id"]
        case "rendering":
            job = await stack.create_job(params={"scenario": "hang"})
            await stack.wait_for_status(job["id"], "processing")
            return job["id"]
        case "downloading":
            await stack.supervisor.stop("media")
            job = await stack.create_job(params={"render_s": 0.1})
            await stack.wait_for_status(job["id"], "downloading")
            return job["id"]
        case _:
            job = await stack.create_job(params={"render_s": 0.1})
            await stack.wait_terminal(job["id"])
            assert _objects(stack, job["id"]), "a ready job has files"
            return job["id"]


async def _restart_paused_workers(stack: Stack) -> None:
    for name in ("submitter", "media"):
        if stack.supervisor.pid(name) is None:
            await stack.supervisor.start(name)


async def _is(stack: Stack, job_id: str, status: str) -> bool:
    return await _render_status(stack, job_id) == status


def _objects(stack: Stack, job_id: str) -> list[Path]:
    root = Path(stack.settings.storage_location().removeprefix("file://"))
    return [p for p in root.rglob("*") if p.is_file() and job_id in str(p)]


async def _no_objects(stack: Stack, job_id: str) -> bool:
    return not _objects(stack, job_id)


async def _row(stack: Stack, job_id: str) -> dict:
    import asyncpg

    conn = await asyncpg.connect(stack.settings.database_url)
    try:
        return dict(await conn.fetchrow(
            "SELECT status, deleted_at, (SELECT reason FROM job_transitions WHERE job_id = j.id ORDER BY id DESC "
            "LIMIT 1) AS last_reason FROM jobs j WHERE id = $1", job_id))
    finally:
        await conn.close()
