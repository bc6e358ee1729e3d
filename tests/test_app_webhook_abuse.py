"""A hostile tenant's webhook endpoints, through the real stack: an endpoint that answers 300 MB, one whose
Retry-After is 1e300, one deleted while an attempt to it hangs, twenty endpoints that never answer beside
another tenant's that answers at once, twenty endpoints on one host, and more retries than anyone needs.
Each bounded: the gateway reads a small prefix, every attempt is counted, a removed endpoint hears nothing
more, a slow tenant holds only its own share of the delivery slots, and every cap answers with the API's
error shape and shows in `GET /v1/account`."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import psutil
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.stack import Stack, demo_key, running_stack, stack_settings
from tests.standins.server import serving
from tests.support import wait_until
from vidjobs.gateway.appwebhooks.deliveries import READ_LIMIT

HUGE_MB = 300


class Listener:
    """An app's endpoints, each misbehaving as its name says; it counts what it sent and how many requests
    it held at once, and, given another app's Listener as `beside`, how many that one held as each request
    arrived here."""

    def __init__(self, beside: Listener | None = None) -> None:
        self.received: dict[str, int] = defaultdict(int)
        self.huge_bytes_sent = 0
        self.let_go = asyncio.Event()
        self.open = 0
        self.most_open = 0
        self.beside = beside
        self.beside_open: list[int] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        name = request.match_info["name"]
        self.received[name] += 1
        if self.beside is not None:
            self.beside_open.append(self.beside.open)
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            return await self._answer(name, request)
        finally:
            self.open -= 1

    async def _answer(self, name: str, request: web.Request) -> web.StreamResponse:
        if name == "huge":
            return await self._huge(request)
        if name == "forever":
            return web.Response(status=503, headers={"Retry-After": request.query.get("after", "1e300")})
        if name == "hang":  # an attempt that fails once it ends: without a check it would be pending again
            await self.let_go.wait()
            return web.Response(status=500)
        if name == "slow":
            await asyncio.sleep(0.3)
        return web.Response(status=204)

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Length": str(HUGE_MB * 2**20)})
        await resp.prepare(request)
        chunk = b"x" * 2**20
        with contextlib.suppress(ConnectionError):
            for _ in range(HUGE_MB):
                await resp.write(chunk)
                self.huge_bytes_sent += len(chunk)
        return resp


@contextlib.asynccontextmanager
async def listeners(*hosts: str, beside: Listener | None = None) -> AsyncIterator[tuple[Listener, list[str]]]:
    """One Listener served on a free port of each host (127.0.0.x: each a host of its own to the gateway)."""
    state = Listener(beside)
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for host in hosts:
            app = web.Application()
            app.router.add_post("/hooks/{name}", state.handle)
            urls.append(await stack.enter_async_context(serving(app, host)))
        yield state, urls


def _allow(urls: list[str]) -> str:
    return ",".join(url.removeprefix("http://") for url in urls)


async def _post(stack: Stack, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with stack.session.post(f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else {})


async def _get(stack: Stack, path: str) -> dict:
    async with stack.session.get(f"{stack.url}{path}", headers=stack.auth) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _endpoint(stack: Stack, url: str, events: list[str] | None = None) -> dict:
    status, body = await _post(stack, "/v1/webhook-endpoints", {"url": url, **({"events": events} if events else {})})
    assert status == 201, body
    return body


async def _rows(stack: Stack, endpoint_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(stack.settings.database_url)
    try:
        return await conn.fetch("SELECT d.*, (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id) "
                                "AS attempt_rows FROM webhook_deliveries d WHERE endpoint_id = $1", endpoint_id)
    finally:
        await conn.close()


async def test_a_huge_answer_an_endless_retry_after_and_a_deleted_endpoint(tmp_path, database_url, nats_url):
    async with listeners("127.0.0.1") as (app, [base]):
        settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=_allow([base]),
                                  app_webhook_retry_s="0.3,0.3,0.3,0.3", app_webhook_timeout_s=20)
        async with running_stack(settings) as stack:
            gateway = psutil.Process(stack.supervisor.pid("gateway"))
            rss_before = gateway.memory_info().rss
            only_done = ["job.completed"]
            huge = await _endpoint(stack, f"{base}/hooks/huge", only_done)
            forever = await _endpoint(stack, f"{base}/hooks/forever", only_done)
            hang = await _endpoint(stack, f"{base}/hooks/hang", only_done)
            job = await stack.create_job(params={"render_s": 0.1})
            await stack.wait_terminal(job["id"])
            await wait_until(lambda: _received(app, "hang", 1), within=30, what="the attempt that hangs")
            # Deleted while its attempt hangs: the attempt ends, and nothing more is sent there.
            async with stack.session.delete(f"{stack.url}/v1/webhook-endpoints/{hang['id']}",
                                            headers=stack.auth) as resp:
                assert resp.status == 204
            app.let_go.set()
            await wait_until(lambda: _received(app, "huge", 1), within=30, what="the huge answer")
            huge_rows = await wait_until(lambda: _settled(stack, huge["id"]), within=30, what="the huge delivery")
            await wait_until(lambda: _settled(stack, forever["id"]), within=30, what="the first Retry-After")
            await asyncio.sleep(2.0)  # several retry intervals: a wrongly pending delivery would go again
            rss_grew = gateway.memory_info().rss - rss_before
            answers_read = _counter(await stack.metrics("gateway"), "vidjobs_app_webhook_answer_bytes_read")
            forever_rows = await _rows(stack, forever["id"])
            hang_rows = await _rows(stack, hang["id"])
            listed = (await _get(stack, f"/v1/webhook-endpoints/{forever['id']}/deliveries"))["data"]

    # 1. A prefix read, the connection dropped: the endpoint could not push its 300 MB into the gateway. The
    # gateway's own count of what it read is the bound (the other answers here are empty, so every byte it
    # counted is the huge one's): exactly READ_LIMIT, 64 KiB. What the endpoint managed to write says the
    # connection was cut rather than drained: only what the sockets' buffers took before the close.
    assert huge_rows[0]["status"] == "delivered" and huge_rows[0]["last_status"] == 200
    assert answers_read == READ_LIMIT == 64 * 1024, answers_read
    assert app.huge_bytes_sent < 64 * 2**20, app.huge_bytes_sent
    assert rss_grew < 100 * 2**20, f"the gateway grew by {rss_grew / 2**20:.0f} MiB"
    # 3. Retry-After: 1e300 is counted as an attempt and waits at most a day; it is not sent again meanwhile.
    assert app.received["forever"] == 1
    row = forever_rows[0]
    assert (row["status"], row["attempts"], row["attempt_rows"], row["last_status"]) == ("pending", 1, 1, 503)
    assert timedelta(hours=23) < row["next_attempt_at"] - datetime.now(UTC) <= timedelta(hours=24, minutes=1)
    assert [a["status"] for a in listed[0]["attempts"]] == [503]
    # 4. The attempt in flight when its endpoint was deleted settles as disabled; no second POST.
    assert app.received["hang"] == 1
    assert [(r["status"], r["attempts"]) for r in hang_rows] == [("disabled", 1)]


def _counter(metrics: str, name: str) -> float:
    """An unlabelled counter's value in Prometheus' text format (`name` without its `_total`)."""
    [family] = [f for f in text_string_to_metric_families(metrics) if f.name == name]
    [total] = [s.value for s in family.samples if s.name == f"{name}_total"]
    return total


async def _received(app: Listener, name: str, count: int) -> bool:
    await asyncio.sleep(0)
    return app.received[name] >= count


async def _settled(stack: Stack, endpoint_id: str) -> list[asyncpg.Record] | None:
    rows = await _rows(stack, endpoint_id)
    return rows if rows and all(r["attempt_rows"] for r in rows) else None


SLOW_HOSTS = [f"127.0.0.{n}" for n in range(2, 22)]
IN_FLIGHT = 6  # the slow tenant's cap: not the default (16), so the cap held is the one set


async def test_a_tenant_whose_endpoints_never_answer_holds_only_its_own_share(tmp_path, database_url, nats_url):
    async with listeners(*SLOW_HOSTS) as (slow, slow_urls), \
            listeners("127.0.0.1", beside=slow) as (quick, [quick_url]):
        # The slow tenant's attempts hang until the test lets them go (the timeout is far beyond the test's
        # length), so none ends and frees its place however slowly the machine runs.
        settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=_allow([*slow_urls, quick_url]),
                                  app_webhook_retry_s="0.2,0.2", app_webhook_timeout_s=600,
                                  webhook_deliveries_in_flight=IN_FLIGHT)
        async with running_stack(settings) as stack:
            other = stack.as_key(await demo_key(stack.settings.database_url))
            limits = (await _get(stack, "/v1/account"))["limits"]
            for url in slow_urls:  # twenty endpoints on twenty hosts, every event, none ever answering
                await _endpoint(stack, f"{url}/hooks/hang")
            await _endpoint(other, f"{quick_url}/hooks/quick", ["job.completed"])
            jobs = await asyncio.gather(*(stack.create_job(params={"render_s": 0.1}) for _ in range(4)))
            await asyncio.gather(*(stack.wait_terminal(j["id"]) for j in jobs))
            await wait_until(lambda: _open(slow, IN_FLIGHT), within=30, what="the slow tenant's attempts")
            waiting = await _waiting(stack)
            mine = await other.create_job(params={"render_s": 0.1})
            await other.wait_terminal(mine["id"])
            await wait_until(lambda: _received(quick, "quick", 1), within=60, what="the quick tenant's delivery")
            held, most_held, sent = slow.open, slow.most_open, slow.received["hang"]
            slow.let_go.set()

    assert limits["webhook_deliveries_in_flight"] == IN_FLIGHT
    # Exactly its cap under way and never more, although far more of its deliveries were due all along and
    # the gateway claimed again meanwhile (for the other tenant's job and its delivery).
    assert waiting > IN_FLIGHT, waiting
    assert held == most_held == sent == IN_FLIGHT, (held, most_held, sent)
    # The other tenant's delivery arrived while every one of the slow tenant's attempts still hung: it took
    # a place of its own rather than waiting for one of theirs to end.
    assert quick.beside_open == [IN_FLIGHT], quick.beside_open


async def _open(app: Listener, count: int) -> bool:
    await asyncio.sleep(0)
    return app.open >= count


async def _waiting(stack: Stack) -> int:
    """Pending deliveries not under way: those waiting for a place."""
    conn = await asyncpg.connect(stack.settings.database_url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND claimed_until IS NULL"))
    finally:
        await conn.close()


async def test_caps_on_endpoints_hosts_rates_and_manual_retries(tmp_path, database_url, nats_url):
    async with listeners("127.0.0.1") as (app, [base]):
        settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=_allow([base]),
                                  app_webhook_retry_s="0.2", max_webhook_endpoints=20,
                                  webhook_deliveries_per_minute=30, max_webhook_manual_retries=2)
        async with running_stack(settings) as stack:
            # 2. The per-URL limit counted URL strings: twenty spellings of one host.
            made = [await _endpoint(stack, f"{base}/hooks/slow?n={n}") for n in range(20)]
            refused = await _post(stack, "/v1/webhook-endpoints", {"url": f"{base}/hooks/slow?n=20"})
            limits = (await _get(stack, "/v1/account"))["limits"]
            job = await stack.create_job(params={"render_s": 0.1})
            await stack.wait_terminal(job["id"])
            await wait_until(lambda: _received(app, "slow", 30), within=60, what="a minute's deliveries")
            await asyncio.sleep(3.0)  # the minute's budget is spent: nothing more goes out for now
            sent = app.received["slow"]
            conn = await asyncpg.connect(stack.settings.database_url)
            try:
                waiting = await conn.fetchval("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")
            finally:
                await conn.close()
            listing = f"/v1/webhook-endpoints/{made[0]['id']}/deliveries"
            first = await _get(stack, f"{listing}?limit=2")
            rest = await _get(stack, f"{listing}?limit=100&cursor={first['next_cursor']}")
            everything = await _get(stack, f"{listing}?limit=100")
            delivery = first["data"][0]
            retry = f"/v1/webhook-endpoints/{made[0]['id']}/deliveries/{delivery['id']}/retry"
            retries = [await _post(stack, retry) for _ in range(4)]

    status, body = refused
    assert status == 429 and body["error"]["code"] == "limit_reached", refused
    assert "20" in body["error"]["message"]
    assert limits["max_webhook_endpoints"] == 20 and limits["webhook_deliveries_per_minute"] == 30
    assert app.most_open <= 4, f"{app.most_open} requests at once to one host"
    assert sent == 30 and waiting > 0, (sent, waiting)  # the rest wait their turn: nothing is dropped
    # 6. The history is paged: two, then the rest, the same as all at once.
    assert len(first["data"]) == 2 and first["next_cursor"] and rest["next_cursor"] is None
    assert [d["id"] for d in first["data"] + rest["data"]] == [d["id"] for d in everything["data"]]
    assert [status for status, _ in retries] == [202, 202, 429, 429], retries
    assert retries[-1][1]["error"]["code"] == "limit_reached"
