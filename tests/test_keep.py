"""Keeping a clip past retention, through the real stack (retention and its warning shrunk to seconds): a kept
clip survives its window while an unkept one is told `job.expiring` (once) before it goes; kept clips count
against the account's storage quota, shown in GET /v1/account, and a keep past it is refused with 409
`storage_quota_exceeded`; a clip released after its window is warned again, and goes a warning's lead later."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg

from tests.stack import Stack, running_stack, stack_settings
from tests.support import wait_until
from tests.test_app_webhooks import ClientApp, client_app
from vidjobs.gateway.accounts import update_limits

# The test waits out a retention window and then a warning's lead (about 20 s in all): what it proves is
# what happens as time passes, and the windows are as short as the sweeps let them be told apart.
RETENTION_S = 6.0
WARNING_S = 3.0
DAY_S = 86400


async def _call(stack: Stack, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with stack.session.request(method, f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
        return resp.status, await resp.json()


def _expiring(app: ClientApp, job_id: str) -> list[dict]:
    return [e for e in app.events("app") if e["type"] == "job.expiring" and e["data"]["id"] == job_id]


async def _set_quota(database_url: str, account_id: str, quota: int) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await update_limits(conn, account_id, storage_quota_bytes=quota) is not None
    finally:
        await conn.close()


async def test_a_kept_clip_outlives_retention_an_unkept_one_is_warned_first_and_quota_holds(
        tmp_path, database_url, nats_url):
    async with client_app() as (app, port):
        settings = stack_settings(
            tmp_path, database_url, nats_url, retention_days=RETENTION_S / DAY_S,
            expiry_warning_days=WARNING_S / DAY_S, retention_sweep_interval_s=0.3,
            webhook_allow_hosts=f"127.0.0.1:{port}", app_webhook_retry_s="0.3,0.3")
        async with running_stack(settings) as stack:
            status, endpoint = await _call(stack, "POST", "/v1/webhook-endpoints", {
                "url": f"http://127.0.0.1:{port}/hooks/app", "events": ["job.expiring"]})
            assert status == 201, endpoint
            made = [await stack.create_job(params={"render_s": 0.2}) for _ in range(3)]
            kept, unkept, over = [await stack.wait_for_status(j["id"], "completed") for j in made]
            out = unkept["outputs"]
            assert out["kept"] is False
            completed_at = datetime.fromisoformat(unkept["completed_at"])
            assert datetime.fromisoformat(out["retained_until"]) >= completed_at + timedelta(seconds=RETENTION_S)

            _, account = await _call(stack, "GET", "/v1/account")
            assert account["storage"] == {"used_bytes": 0, "limit_bytes": settings.storage_quota_bytes,
                                          "kept_jobs": 0}
            quota = kept["outputs"]["bytes"] + over["outputs"]["bytes"] - 1
            await _set_quota(database_url, account["id"], quota)

            status, body = await _call(stack, "POST", f"/v1/jobs/{kept['id']}/keep")
            assert status == 200, body
            assert body["outputs"]["kept"] is True and body["outputs"]["retained_until"] is None
            assert (await _call(stack, "POST", f"/v1/jobs/{kept['id']}/keep"))[0] == 200  # again: no change
            status, refused = await _call(stack, "POST", f"/v1/jobs/{over['id']}/keep")
            assert status == 409 and refused["error"]["code"] == "storage_quota_exceeded", refused
            assert "storage quota" in refused["error"]["message"]
            _, account = await _call(stack, "GET", "/v1/account")
            assert account["storage"] == {"used_bytes": kept["outputs"]["bytes"], "limit_bytes": quota,
                                          "kept_jobs": 1}
            status, missing = await _call(stack, "POST", "/v1/jobs/job_nosuchjob/keep")
            assert status == 404 and missing["error"]["code"] == "not_found"

            # The unkept clip's app hears of it while it is still there, then it goes; the kept one stays.
            await wait_until(lambda: _heard(app, unkept["id"]), within=30, what="job.expiring for the unkept job")
            told = _expiring(app, unkept["id"])[0]
            assert told["data"]["status"] == "completed" and told["data"]["outputs"]["video_url"]
            await stack.wait_for_status(unkept["id"], "expired", within=30)
            await stack.wait_for_status(over["id"], "expired", within=30)
            await asyncio.sleep(1.0)  # a few more sweeps: the kept clip is passed over every time
            still = await stack.job(kept["id"])
            assert still["status"] == "completed" and still["outputs"]["kept"] is True
            assert datetime.now(datetime.fromisoformat(still["completed_at"]).tzinfo) > \
                datetime.fromisoformat(still["completed_at"]) + timedelta(seconds=RETENTION_S)
            assert (await stack.download(still["outputs"]["video_url"]))[0] == 200
            assert _expiring(app, kept["id"]) == []
            assert len(_expiring(app, unkept["id"])) == 1  # once per job, however many sweeps ran

            # Released long after its window: told now, removed a warning's lead later, not at once.
            status, released = await _call(stack, "DELETE", f"/v1/jobs/{kept['id']}/keep")
            assert status == 200 and released["outputs"]["kept"] is False, released
            assert datetime.fromisoformat(released["outputs"]["retained_until"]) > datetime.fromisoformat(
                released["updated_at"]) + timedelta(seconds=WARNING_S - 1)
            _, account = await _call(stack, "GET", "/v1/account")
            assert account["storage"]["used_bytes"] == 0 and account["storage"]["kept_jobs"] == 0
            await wait_until(lambda: _heard(app, kept["id"]), within=30, what="job.expiring for the released job")
            assert _expiring(app, kept["id"])[0]["data"]["status"] == "completed"
            await stack.wait_for_status(kept["id"], "expired", within=30)
            status, late = await _call(stack, "POST", f"/v1/jobs/{kept['id']}/keep")
            assert status == 409 and late["error"]["code"] == "conflict" and "expired" in late["error"]["message"]


async def _heard(app: ClientApp, job_id: str) -> bool:
    await asyncio.sleep(0)
    return bool(_expiring(app, job_id))
