"""Webhooks to an account's app, through the real stack: a client app (an aiohttp server in this test)
receives signed job events, verified with the Standard Webhooks reference algorithm; an endpoint that
answers 500 twice is retried until it takes the event; one that answers 410 is disabled and hears nothing
more; a private address is refused; a job's own webhook_url is signed with the account's secret; every
attempt is visible, and a delivery can be sent again. The secrets are kept sealed (no `whsec_` in the
database, an upgraded database's too), and a rotated secret signs beside the new one until its overlap ends."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import asyncpg
from aiohttp import web

from tests.stack import Stack, running_stack, stack_settings
from tests.standins.server import serving
from tests.support import wait_until
from vidjobs.common import creation, db, deletion, events, transitions
from vidjobs.common.jobs import JobRequest
from vidjobs.common.signatures import new_secret
from vidjobs.common.states import JobStatus
from vidjobs.gateway.accounts import create_account
from vidjobs.gateway.appwebhooks import deliveries


def reference_verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks algorithm as its specification gives it, written here rather than imported."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(sig.split(",", 1)[1], expected)
               for sig in headers["webhook-signature"].split() if sig.startswith("v1,"))


class ClientApp:
    """Records every delivery; `flaky` answers 500 to its first two job.completed attempts; `stuck` answers
    nothing until the test lets it go."""

    def __init__(self) -> None:
        self.received: dict[str, list[tuple[dict[str, str], bytes]]] = defaultdict(list)
        self.failures_left = 2
        self.let_go = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        name = request.match_info["name"]
        self.received[name].append(({k.lower(): v for k, v in request.headers.items()}, body))
        if name == "stuck":
            await self.let_go.wait()
        if name == "gone":
            return web.Response(status=410)
        if name == "flaky" and json.loads(body)["type"] == "job.completed" and self.failures_left:
            self.failures_left -= 1
            return web.Response(status=500)
        return web.Response(status=204)

    def events(self, name: str) -> list[dict]:
        return [json.loads(body) for _, body in self.received[name]]


@asynccontextmanager
async def client_app(host: str = "127.0.0.1", app_state: ClientApp | None = None,
                     ) -> AsyncIterator[tuple[ClientApp, int]]:
    app_state = app_state or ClientApp()
    app = web.Application()
    app.router.add_post("/hooks/{name}", app_state.handle)
    async with serving(app, host) as url:
        yield app_state, int(url.rsplit(":", 1)[1])


async def test_an_app_hears_of_its_jobs_signed_retried_and_never_after_410(tmp_path, database_url, nats_url):
    async with client_app() as (app, port):
        base = f"http://127.0.0.1:{port}/hooks"
        settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=f"127.0.0.1:{port}",
                                  app_webhook_retry_s="0.3,0.3,0.3")
        async with running_stack(settings) as stack:
            async def post(path: str, body: dict) -> tuple[int, dict]:
                async with stack.session.post(f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
                    return resp.status, await resp.json()

            async def get(path: str) -> dict:
                async with stack.session.get(f"{stack.url}{path}", headers=stack.auth) as resp:
                    assert resp.status == 200, await resp.text()
                    return await resp.json()

            status, flaky = await post("/v1/webhook-endpoints", {"url": f"{base}/flaky", "events": ["job.completed"]})
            assert status == 201, flaky
            _, gone = await post("/v1/webhook-endpoints", {"url": f"{base}/gone"})
            private = [await post("/v1/webhook-endpoints", {"url": url})
                       for url in ("http://10.1.2.3/hook", "https://169.254.169.254/latest", "http://127.0.0.1:9/x")]
            status, made = await post("/v1/account/webhook-secret", {})
            assert status == 201, made
            account_secret = made["secret"]
            job = await stack.create_job(params={"render_s": 0.2}, webhook_url=f"{base}/own")
            done = await stack.wait_terminal(job["id"])
            await wait_until(lambda: _delivered(app, "flaky", 3), within=30, what="the third attempt")
            await wait_until(lambda: _delivered(app, "own", 1), within=30, what="the job's own webhook")
            second = await stack.create_job(params={"render_s": 0.1})
            await stack.wait_terminal(second["id"])
            await wait_until(lambda: _delivered(app, "flaky", 4), within=30, what="the second job's event")
            endpoints = {e["id"]: e for e in (await get("/v1/webhook-endpoints"))["data"]}
            deliveries = (await get(f"/v1/webhook-endpoints/{flaky['id']}/deliveries"))["data"]
            first_delivery = next(d for d in deliveries if d["job_id"] == job["id"])
            async with stack.session.post(
                    f"{stack.url}/v1/webhook-endpoints/{flaky['id']}/deliveries/{first_delivery['id']}/retry",
                    headers=stack.auth) as resp:
                retried = resp.status
            await wait_until(lambda: _delivered(app, "flaky", 5), within=30, what="the delivery sent again")
        in_the_clear = await plaintext_secrets(database_url)

    assert in_the_clear == []
    assert done["status"] == "completed"
    assert flaky["secret"].startswith("whsec_") and "secret" not in endpoints[flaky["id"]]
    for status, body in private:
        assert status == 422 and "VIDJOBS_WEBHOOK_ALLOW_HOSTS" in body["error"]["message"], body

    first_three = app.received["flaky"][:3]
    assert all(reference_verify(flaky["secret"], headers, body) for headers, body in app.received["flaky"])
    assert len({headers["webhook-id"] for headers, _ in first_three}) == 1  # one message, three attempts
    event = app.events("flaky")[0]
    assert (event["type"], event["data"]["id"], event["data"]["status"]) == ("job.completed", job["id"], "completed")
    assert event["data"]["outputs"]["sha256"] == done["outputs"]["sha256"]
    assert [d["status"] for d in first_delivery["attempts"]] == [500, 500, 204]
    assert first_delivery["status"] == "delivered" and retried == 202

    # 410 on its first delivery: disabled, and nothing after it, although the jobs went on moving. Deliveries of
    # the first job's events already under way beside the one answered 410 may land too (on a loaded machine
    # they overlap); nothing of the second job, created after the endpoint was disabled, ever does.
    gone_jobs = {event["data"]["id"] for event in app.events("gone")}
    assert gone_jobs == {job["id"]}, gone_jobs
    assert endpoints[gone["id"]]["disabled_at"] is not None

    own = app.events("own")
    assert [e["type"] for e in own] == ["job.completed"]  # a job's own URL hears its endings by default
    assert all(reference_verify(account_secret, headers, body) for headers, body in app.received["own"])
    assert not reference_verify(flaky["secret"], *app.received["own"][0])


async def _delivered(app: ClientApp, name: str, count: int) -> bool:
    await asyncio.sleep(0)
    return len(app.received[name]) >= count


async def test_an_endpoint_that_never_answers_holds_up_neither_jobs_nor_other_hosts(tmp_path, database_url,
                                                                                     nats_url):
    # Two hosts of one app (in-flight limits count hosts): `stuck` on one, `quick` on the other.
    async with client_app() as (app, port), client_app("127.0.0.2", app) as (_, other_port):
        urls = {"stuck": f"http://127.0.0.1:{port}/hooks/stuck", "quick": f"http://127.0.0.2:{other_port}/hooks/quick"}
        settings = stack_settings(tmp_path, database_url, nats_url,
                                  webhook_allow_hosts=f"127.0.0.1:{port},127.0.0.2:{other_port}",
                                  app_webhook_retry_s="0.2," * 20 + "0.2", app_webhook_timeout_s=30)
        async with running_stack(settings) as stack:
            for url in urls.values():
                async with stack.session.post(f"{stack.url}/v1/webhook-endpoints", headers=stack.auth,
                                              json={"url": url}) as resp:
                    assert resp.status == 201
            jobs = await asyncio.gather(*(stack.create_job(params={"render_s": 0.1}) for _ in range(8)))
            done = await asyncio.gather(*(stack.wait_terminal(j["id"]) for j in jobs))
            # Every job's ending reaches the quick endpoint while the stuck one has answered nothing.
            await wait_until(lambda: _completed(app, "quick", 8), within=30, what="every quick delivery")
            stuck_so_far = len(app.received["stuck"])
            app.let_go.set()

    assert [j["status"] for j in done] == ["completed"] * 8
    assert {e["data"]["id"] for e in app.events("quick") if e["type"] == "job.completed"} == {j["id"] for j in jobs}
    assert 1 <= stuck_so_far <= 4  # a few at once to the stuck host (its in-flight cap), never one per event


async def _completed(app: ClientApp, name: str, count: int) -> bool:
    await asyncio.sleep(0)
    return sum(e["type"] == "job.completed" for e in app.events(name)) >= count


async def plaintext_secrets(database_url: str) -> list[str]:
    """`table.column` of every text column of webhook_endpoints and accounts that holds a `whsec_` secret."""
    conn = await asyncpg.connect(database_url)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name IN ('webhook_endpoints', 'accounts') AND data_type IN ('text', 'character varying', "
            "'character', 'ARRAY', 'json', 'jsonb', 'bytea')")
        assert {(c["table_name"], c["column_name"]) for c in columns} >= {("webhook_endpoints", "url"),
                                                                          ("accounts", "name")}
        found = []
        for c in columns:
            table, column = c["table_name"], c["column_name"]
            holding = f'SELECT count(*) FROM "{table}" WHERE position(\'whsec_\' in "{column}"::text) > 0'
            if await conn.fetchval(holding):
                found.append(f"{table}.{column}")
        return found
    finally:
        await conn.close()


async def _post(stack: Stack, path: str, body: dict) -> dict:
    async with stack.session.post(f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
        answer = await resp.json()
        assert resp.status in (200, 201), (path, answer)
        return answer


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


OVERLAP_S = 3600  # far beyond the test: the overlap is ended below by its expiry, not by waiting it out


async def test_after_a_rotation_deliveries_verify_with_both_secrets_until_the_overlap_ends(tmp_path, database_url,
                                                                                            nats_url):
    async with client_app() as (app, port):
        base = f"http://127.0.0.1:{port}/hooks"
        settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=f"127.0.0.1:{port}")
        async with running_stack(settings) as stack:
            endpoint = await _post(stack, "/v1/webhook-endpoints", {"url": f"{base}/app", "events": ["job.completed"]})
            account = await _post(stack, "/v1/account/webhook-secret", {})
            rotated = await _post(stack, f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret",
                                  {"overlap_s": OVERLAP_S})
            account_rotated = await _post(stack, "/v1/account/webhook-secret", {"overlap_s": OVERLAP_S})
            during = await stack.create_job(params={"render_s": 0.1}, webhook_url=f"{base}/own")
            await stack.wait_terminal(during["id"])
            await wait_until(lambda: _both_delivered(app, 1), within=30, what="the deliveries during the overlap")
            ended_at = await _end_overlaps(database_url, endpoint["id"])
            after = await stack.create_job(params={"render_s": 0.1}, webhook_url=f"{base}/own")
            await stack.wait_terminal(after["id"])
            await wait_until(lambda: _both_delivered(app, 2), within=30, what="the deliveries after the overlap")

    old, new = endpoint["secret"], rotated["secret"]
    account_old, account_new = account["secret"], account_rotated["secret"]
    assert len({old, new, account_old, account_new}) == 4
    # Each rotation asked for its overlap, and each was still running when its delivery was signed.
    for issued in (rotated, account_rotated):
        overlap = _at(issued["previous_secret_expires_at"]) - _at(issued["created_at"])
        assert abs(overlap - OVERLAP_S) < 1, issued
    [(headers, body), (later_headers, later_body)] = app.received["app"]
    [(own_headers, own_body), (own_later_headers, own_later_body)] = app.received["own"]
    assert int(headers["webhook-timestamp"]) < ended_at and int(own_headers["webhook-timestamp"]) < ended_at
    assert len(headers["webhook-signature"].split()) == 2
    assert reference_verify(new, headers, body) and reference_verify(old, headers, body)
    assert reference_verify(account_new, own_headers, own_body) and reference_verify(account_old, own_headers, own_body)
    # Once the overlaps ended, the new secrets alone sign.
    assert len(later_headers["webhook-signature"].split()) == 1
    assert reference_verify(new, later_headers, later_body) and not reference_verify(old, later_headers, later_body)
    assert reference_verify(account_new, own_later_headers, own_later_body)
    assert not reference_verify(account_old, own_later_headers, own_later_body)


async def _end_overlaps(database_url: str, endpoint_id: str) -> float:
    """End both rotations' overlaps now, as the clock reaching their expiry would (the gateway reads the expiry
    at each delivery); when they ended, in epoch seconds."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            ended = await conn.fetchval(
                "UPDATE webhook_endpoints SET previous_secret_expires_at = clock_timestamp() WHERE id = $1 "
                "RETURNING previous_secret_expires_at", endpoint_id)
            changed = await conn.execute(
                "UPDATE accounts SET webhook_previous_secret_expires_at = $1 "
                "WHERE webhook_previous_secret_expires_at IS NOT NULL", ended)
        assert changed == "UPDATE 1", changed
        return float(ended.timestamp())
    finally:
        await conn.close()


async def _both_delivered(app: ClientApp, count: int) -> bool:
    await asyncio.sleep(0)
    return len(app.received["app"]) >= count and len(app.received["own"]) >= count


async def test_an_upgrade_seals_the_plaintext_secrets_and_deliveries_still_verify(tmp_path, empty_database_url,
                                                                                  nats_url):
    endpoint_secret, account_secret = new_secret(), new_secret()
    async with client_app() as (app, port):
        base = f"http://127.0.0.1:{port}/hooks"
        conn = await asyncpg.connect(empty_database_url)
        await db.init_connection(conn)
        try:
            # The schema as the previous release left it, its secrets in plain text.
            await db._apply_pending(conn, [m for m in db._migration_files() if m[0] <= 14])  # before 0015
            account_id, key = await create_account(conn, "old", credits=1_000_000, concurrency=8,
                                                   requests_per_s=1000.0, request_burst=1000)
            await conn.execute("INSERT INTO webhook_endpoints (id, account_id, url, secret, events) "
                               "VALUES ('whe_old', $1, $2, $3, '{job.completed}')",
                               account_id, f"{base}/old", endpoint_secret)
            await conn.execute("UPDATE accounts SET webhook_secret = $2 WHERE id = $1", account_id, account_secret)
        finally:
            await conn.close()
        in_the_clear_before = set(await plaintext_secrets(empty_database_url))
        assert in_the_clear_before == {"webhook_endpoints.secret", "accounts.webhook_secret"}

        settings = stack_settings(tmp_path, empty_database_url, nats_url, webhook_allow_hosts=f"127.0.0.1:{port}")
        async with running_stack(settings, key=key) as stack:
            in_the_clear = await plaintext_secrets(empty_database_url)
            job = await stack.create_job(params={"render_s": 0.1}, webhook_url=f"{base}/own")
            await stack.wait_terminal(job["id"])
            await wait_until(lambda: _delivered(app, "old", 1), within=30, what="the endpoint's delivery")
            await wait_until(lambda: _delivered(app, "own", 1), within=30, what="the job's own delivery")

    assert in_the_clear == []
    [(headers, body)] = app.received["old"]
    assert reference_verify(endpoint_secret, headers, body)
    [(own_headers, own_body)] = app.received["own"]
    assert reference_verify(account_secret, own_headers, own_body)


async def test_a_job_deleted_while_live_is_canceled_but_told_to_no_app(pool):
    """Deleting a live job cancels it through the transition function, which stages the app event a cancel
    stages; the job is hidden in the same transaction, so the fan-out finds nobody to tell (the job reads as
    never having existed, and a delivery's body is the job as the API shows it)."""
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "apps", credits=100, concurrency=2)
        await conn.execute("INSERT INTO webhook_endpoints (id, account_id, url, secret, events) "
                           "VALUES ('we_del', $1, 'https://example.com/hook', $2, $3)",
                           account_id, new_secret(), ["job.canceled", "job.stage"])
        async with conn.transaction():
            job = await creation.create(conn, account_id=account_id, request=JobRequest(model="fake/x", prompt="p"),
                                        estimated_credits=10, recovery_delay_s=60)
        await transitions.transition(conn, job.id, JobStatus.SUBMITTED, reason="test",
                                     update=transitions.JobUpdate(provider_job_id="rnd_del"))
        await conn.execute("DELETE FROM outbox")
        async with conn.transaction():
            assert await deletion.soft_delete(conn, job.id, account_id)
    staged = [events.decode(r["subject"], bytes(r["payload"])) for r in await pool.fetch(
        "SELECT subject, payload FROM outbox WHERE subject = $1", events.APP_EVENTS)]

    assert [(e.job_id, e.types) for e in staged if isinstance(e, events.AppEventDue)] == [
        (job.id, ["job.stage", "job.canceled"])]
    assert [await deliveries.fan_out(pool, e) for e in staged if isinstance(e, events.AppEventDue)] == [0]
    assert await pool.fetchval("SELECT count(*) FROM webhook_deliveries") == 0
