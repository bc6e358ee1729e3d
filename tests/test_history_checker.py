"""The fault suite's history checker (tests/faults/checker.py) against a real stack: a small mixed history from
two accounts, each with a webhook endpoint served here, is checked clean; then one violation of each kind that
can be made from outside is planted on the same run, and each is reported with its promise and its job."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import nats
from aiohttp import web

from tests.faults.checker import PROMISES, History, Receipt, check_history
from tests.faults.harness import FaultRun, fault_run
from tests.faults.promises import MAX_RESTARTS, no_restart_loop
from tests.faults.quiescence import settle
from tests.stack import Stack, demo_key
from tests.standins.server import serving
from vidjobs.common import events
from vidjobs.common.bus import DEAD_PREFIX
from vidjobs.storage.factory import open_storage

SEED = 20261205
FAST = {"render_s": 1, "clip": "tiny"}


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks check, as its specification gives it."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(sig.split(",", 1)[1], expected)
               for sig in headers["webhook-signature"].split() if sig.startswith("v1,"))


class Receivers:
    """The load's webhook receivers: one path per endpoint, each delivery recorded as a Receipt."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.secrets: dict[str, str] = {}  # endpoint id -> its secret
        self.named: dict[str, str] = {}  # the path's name -> the endpoint registered with it

    async def handle(self, request: web.Request) -> web.Response:
        endpoint_id, body = self.named[request.match_info["name"]], await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        event = json.loads(body)
        self.history.received.append(Receipt(endpoint_id, headers["webhook-id"], event["type"], event["data"]["id"],
                                             verified(self.secrets.get(endpoint_id, ""), headers, body)))
        return web.Response(status=204)


@asynccontextmanager
async def receivers(history: History) -> AsyncIterator[tuple[Receivers, str]]:
    state = Receivers(history)
    app = web.Application()
    app.router.add_post("/hooks/{name}", state.handle)
    async with serving(app) as url:
        yield state, url


async def call(stack: Stack, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with stack.session.request(method, f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else {})


async def open_account(run: FaultRun, key: str, hooks: Receivers, base: str) -> tuple[Stack, str]:
    """An account of the load: its balance noted, and a webhook endpoint of its own whose URL names it."""
    stack = run.stack.as_key(key)
    _, account = await call(stack, "GET", "/v1/account")
    hooks.history.accounts[account["id"]] = key
    hooks.history.balances_before[account["id"]] = account["credits"]["balance"]
    status, made = await call(stack, "POST", "/v1/webhook-endpoints", {"url": f"{base}/hooks/{account['id']}"})
    assert status == 201, made
    hooks.named[account["id"]] = made["id"]
    hooks.secrets[made["id"]] = made["secret"]
    hooks.history.endpoints[made["id"]] = account["id"]
    return stack, account["id"]


async def make_history(run: FaultRun, hooks: Receivers, base: str) -> dict[str, str]:
    """The load: jobs of several scenarios from two accounts, one canceled while it renders and one deleted
    once completed; returns the jobs by name, once everything has settled."""
    history = hooks.history
    a, a_id = await open_account(run, run.stack.key, hooks, base)
    b, b_id = await open_account(run, await demo_key(run.database_url), hooks, base)
    plan = {"a_ok": (a, {}), "a_retry": (a, {"scenario": "fail_then_succeed", "failures": 1}),
            "a_rejected": (a, {"scenario": "content_rejected"}), "a_cancel": (a, {"render_s": 30}),
            "b_ok": (b, {}), "b_poll": (b, {"scenario": "no_callback"}), "b_gone": (b, {})}
    jobs = {}
    for name, (stack, params) in plan.items():
        job = await stack.create_job(params={**FAST, **params})
        jobs[name] = job["id"]
        history.acknowledged[job["id"]] = a_id if stack is a else b_id
    await a.wait_for_status(jobs["a_cancel"], "submitted", "processing")
    status, _ = await call(a, "POST", f"/v1/jobs/{jobs['a_cancel']}/cancel")
    assert status == 200
    history.canceled.add(jobs["a_cancel"])
    for name, job_id in jobs.items():
        await (a if name.startswith("a") else b).wait_terminal(job_id, within=60)
    status, _ = await call(b, "DELETE", f"/v1/jobs/{jobs['b_gone']}")
    assert status in (200, 202, 204), status
    history.deleted.add(jobs["b_gone"])
    await settle(run, history)
    return jobs


async def plant(run: FaultRun, history: History, jobs: dict[str, str]) -> set[tuple[str, str | None]]:
    """One violation of each kind that can be made from outside; returns (promise, job) of each."""
    a_id, b_id = list(history.accounts)
    storage = open_storage(run.stack.settings)
    conn = await asyncpg.connect(run.database_url)
    try:
        video = await conn.fetchval("SELECT key FROM assets WHERE job_id = $1 AND kind = 'video'", jobs["a_ok"])
        await storage.delete(video)
        await conn.execute("UPDATE assets SET bytes = bytes + 1 WHERE job_id = $1 AND kind = 'thumbnail'",
                           jobs["b_ok"])
        await conn.execute("INSERT INTO job_transitions (job_id, from_status, to_status, reason) "
                           "VALUES ($1, 'failed', 'pending', 'planted')", jobs["a_rejected"])
        await conn.execute("UPDATE accounts SET credits_balance = credits_balance - 7 WHERE id = $1", b_id)
        await storage.put_bytes(f"accounts/{a_id}/jobs/job_planted_orphan/video.mp4", b"not ours", "video/mp4")
    finally:
        await conn.close()
        await storage.close()
    moved = next(i for i, r in enumerate(history.received)
                 if r.job_id == jobs["a_retry"] and r.event_type == "job.completed")
    b_endpoint = next(e for e, owner in history.endpoints.items() if owner == b_id)
    history.received[moved] = dataclasses.replace(history.received[moved], endpoint_id=b_endpoint)
    history.acknowledged["job_never_created"] = a_id
    fake = run.stack.settings.fake_provider_url
    render = {"model": "default", "prompt": "a second render", "duration_s": 1,
              "params": {"render_s": 0, "clip": "tiny"}, "metadata": {"job_id": jobs["b_poll"], "attempt": 1}}
    async with run.stack.session.post(f"{fake}/v1/renders", json=render) as resp:
        assert resp.status == 201, await resp.text()
    await bury_without_reason(run, jobs["b_ok"])
    return {("outputs_stored", jobs["a_ok"]), ("outputs_stored", jobs["b_ok"]), ("trail_legal", jobs["a_rejected"]),
            ("money", None), ("no_orphans", "job_planted_orphan"), ("webhook_own_account", jobs["a_retry"]),
            ("job_accounted", "job_never_created"), ("one_render_per_attempt", jobs["b_poll"]),
            ("dead_letters_explained", jobs["b_ok"])}


async def bury_without_reason(run: FaultRun, job_id: str) -> None:
    """A dead letter as `bus` keeps one, about a job, but with no reason given."""
    event = events.DownloadRequested(job_id=job_id)
    nc = await nats.connect(run.stack.settings.nats_url.split(","))
    try:
        await nc.jetstream().publish(f"{DEAD_PREFIX}.planted", events.encode(event),
                                     headers={"Vidjobs-Original-Subject": events.subject_for(event)})
    finally:
        await nc.close()


async def test_the_checker_passes_a_clean_history_and_names_every_planted_violation():
    history = History(seed=SEED)
    async with receivers(history) as (hooks, base):
        port = base.rsplit(":", 1)[1]
        async with fault_run("history_checker", backlog=0, webhook_allow_hosts=f"127.0.0.1:{port}",
                             app_webhook_retry_s="0.3,0.3,0.3") as run:
            jobs = await make_history(run, hooks, base)
            clean = await check_history(run, history)
            assert clean == [], "\n".join([*map(str, clean), str(jobs)])
            planted = await plant(run, history, jobs)
            found = await check_history(run, history)
            await unplant_trail(run, jobs["a_rejected"])
    reported = {(v.promise, v.job_id) for v in found}
    assert planted <= reported, (planted - reported, "\n".join(map(str, found)))
    # Moving a receipt to another account's endpoint also leaves the delivery its own endpoint recorded as
    # delivered without a receipt: the only report beyond the planted ones.
    assert {p for p, _ in reported} <= {p for p, _ in planted} | {"webhook_delivered"}, "\n".join(map(str, found))
    assert all(v.promise in PROMISES and f"seed {SEED}" in str(v) for v in found)
    assert all(v.job_id in str(v) for v in found if v.job_id)
    print(f"clean history of {len(jobs)} jobs, {len(history.received)} deliveries: no violation; "
          f"{len(planted)} planted, {len(found)} reported:\n" + "\n".join(map(str, found)))


async def unplant_trail(run: FaultRun, job_id: str) -> None:
    """Take the planted move away, so the stack's own exit check (every trail legal) sees the real history."""
    conn = await asyncpg.connect(run.database_url)
    try:
        await conn.execute("DELETE FROM job_transitions WHERE job_id = $1 AND reason = 'planted'", job_id)
    finally:
        await conn.close()


def test_a_service_restarting_past_the_limit_is_a_restart_loop():
    starts = {"gateway": 1, "media": 1 + MAX_RESTARTS, "poller": 2 + MAX_RESTARTS}
    assert [(v.promise, v.detail) for v in no_restart_loop(starts)] == [
        ("no_restart_loop", f"poller was restarted {MAX_RESTARTS + 1} times (at most {MAX_RESTARTS})")]
