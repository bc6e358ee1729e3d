"""Webhooks to an account's app, through the real stack: a client app (an aiohttp server in this test)
receives signed job events, verified with the Standard Webhooks reference algorithm; an endpoint that
answers 500 twice is retried until it takes the event; one that answers 410 is disabled and hears nothing
more; a private address is refused; a job's own webhook_url is signed with the account's secret; every
attempt is visible, and a delivery can be sent again."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from tests.stack import running_stack, stack_settings
from tests.standins.server import serving
from tests.support import wait_until


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
            account_secret = (await get("/v1/account/webhook-secret"))["secret"]
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

    # 410 on its first delivery: disabled, and nothing after it, although the jobs went on moving.
    assert len(app.received["gone"]) == 1
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
