"""The nemesis's load: several accounts using the public API as products do, while faults come and go, and the
history of what the API told them (what the checker holds the system to).

Each account has an app webhook endpoint of its own, served here, that answers (204), fails (500) or hangs
(never answers within the gateway's timeout), by the account's turn. Every few hundred milliseconds one
action is drawn by the run's RNG: a create (of a fake-provider scenario drawn by weight, now and then from an
uploaded first frame), a cancel or delete of one of the account's jobs, a rerun, a keep, an export of a
completed job. Every call goes through faults the way a client's does: retried with the same
Idempotency-Key while the answer is 429, 5xx or no answer, up to `CALL_WITHIN_S`; a create counts as
acknowledged only once the API answered it 2xx."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.faults.history import History, Receipt
from tests.imagefiles import png_with_text
from vidjobs.common import signatures
from vidjobs.common.errors import WebhookRejected

CALL_WITHIN_S = 45.0  # a call still failing after this long is given up (and recorded as such)
CALL_TIMEOUT_S = 10.0
ENDPOINT_MODES = ("answers", "fails", "hangs")
HANG_S = 60.0  # longer than the gateway waits for an endpoint
# The fake provider's scenarios, by weight. Left out: `hang` (its render outlives a short run: the deadline
# ends it, which a long run shows), and the refusals of our provider account (`no_credit`, `key_refused`,
# `key_revoked`: they open the provider's breaker, and every other job waits behind it for the operator).
SCENARIOS = {
    "succeed": 10, "duplicate_callbacks": 3, "no_callback": 3, "rate_limit_then_succeed": 2,
    "unavailable_then_succeed": 2, "content_rejected": 1, "fail_always": 1, "fail_then_succeed": 2,
    "accept_then_timeout": 1, "accept_then_drop": 1, "bad_output": 1, "expired_output": 1,
}
ACTIONS = {"create": 10, "cancel": 2, "delete": 1, "rerun": 1, "keep": 1, "export": 1}
IMAGE_EVERY = 6  # about one create in this many renders from an uploaded first frame


@dataclass
class Account:
    id: str
    key: str
    mode: str  # what its endpoint does: answers, fails, hangs
    endpoint_id: str = ""
    secret: str = ""
    jobs: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """The calls the load made, by action and answer, for the report; and those never answered."""

    calls: dict[str, int] = field(default_factory=dict)  # "<action> <status>" -> count
    given_up: list[str] = field(default_factory=list)  # calls with no answer but 429/5xx within CALL_WITHIN_S

    def count(self, action: str, status: int | str) -> None:
        name = f"{action} {status}"
        self.calls[name] = self.calls.get(name, 0) + 1


class Receivers:
    """The accounts' app endpoints: one route per account, doing what its mode says, keeping every delivery."""

    def __init__(self, history: History):
        self.history = history
        self.by_endpoint: dict[str, Account] = {}
        self.completed: set[str] = set()  # jobs an endpoint heard had completed
        self.bases: list[str] = []  # one per account, each on a loopback address of its own

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        account = self.by_endpoint.get(request.match_info["endpoint"])
        if account is None:
            return web.Response(status=404)
        try:
            event_id = signatures.verify(account.secret, request.headers, body)
            verified = True
        except WebhookRejected:
            event_id, verified = request.headers.get("webhook-id", ""), False
        event = json.loads(body)
        if event.get("type") == "job.completed":
            self.completed.add(str(event.get("data", {}).get("id", "")))
        self.history.received.append(Receipt(account.endpoint_id, event_id, event.get("type", ""),
                                             str(event.get("data", {}).get("id", "")), verified))
        if account.mode == "fails":
            return web.Response(status=500)
        if account.mode == "hangs":
            await asyncio.sleep(HANG_S)
        return web.Response(status=204)

    @asynccontextmanager
    async def serving(self, hosts: int) -> AsyncIterator[Receivers]:
        """The receivers on `hosts` loopback addresses (127.0.0.1, .2, ...), one account's endpoint on each: the
        gateway caps attempts per host, so endpoints on one host would share one cap, as a real app's do."""
        app = web.Application()
        app.router.add_post("/hooks/{endpoint}", self.handle)
        # The endpoint that hangs holds its requests for a minute: at the end they are cut, not waited for.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        try:
            for i in range(hosts):
                site = web.TCPSite(runner, f"127.0.0.{i + 1}", 0)
                await site.start()
            self.bases = [f"http://{host}:{port}" for host, port in runner.addresses]
            yield self
        finally:
            await runner.cleanup()


class Load:
    def __init__(self, gateway_url: str, session: aiohttp.ClientSession, history: History, rng: random.Random,
                 receivers: Receivers, *, export_url: Any):
        self.url = gateway_url
        self.receivers = receivers
        self.tally = Tally()
        self.session = session
        self.history = history
        self.rng = rng
        self.accounts: list[Account] = []
        self.export_url = export_url  # () -> a presigned PUT URL of the accounts' own bucket
        self.tasks: set[asyncio.Task[None]] = set()
        self.image: bytes = png_with_text((64, 36))

    # calls through faults

    async def call(self, account: Account, action: str, method: str, path: str, *, body: Any = None,
                   data: bytes | None = None, idempotent: bool = True) -> tuple[int, dict]:
        """The API's answer, retried with one Idempotency-Key through 429, 5xx and no answer; (0, {}) when it
        never answered within CALL_WITHIN_S."""
        headers = {"Authorization": f"Bearer {account.key}"}
        if idempotent:
            headers["Idempotency-Key"] = f"nemesis-{secrets.token_hex(8)}"
        if data is not None:
            headers["Content-Type"] = "image/png"
        deadline = time.monotonic() + CALL_WITHIN_S
        while True:
            status, answer = await self._once(method, path, headers, body, data)
            self.tally.count(action, status or "no answer")
            if status and status != 429 and status < 500:
                return status, answer
            if time.monotonic() > deadline:
                self.tally.given_up.append(f"{action} {method} {path}: last {status or 'no answer'}")
                return 0, {}
            await asyncio.sleep(0.5 + self.rng.random())

    async def _once(self, method: str, path: str, headers: dict[str, str], body: Any,
                    data: bytes | None) -> tuple[int, dict]:
        try:
            async with self.session.request(method, f"{self.url}{path}", json=body, data=data, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as resp:
                try:
                    return resp.status, (await resp.json(content_type=None)) or {}
                except ValueError:
                    return resp.status, {}
        except (aiohttp.ClientError, TimeoutError):
            return 0, {}

    # accounts

    async def add_account(self, key: str, mode: str) -> Account:
        receivers = self.receivers
        probe = Account("", key, mode)
        status, me = await self.call(probe, "account", "GET", "/v1/account", idempotent=False)
        assert status == 200, me
        account = Account(me["id"], key, mode)
        status, made = await self.call(account, "endpoint", "POST", "/v1/webhook-endpoints",
                                       body={"url": f"{receivers.bases[len(self.accounts)]}/hooks/{account.id}"})
        assert status == 201, made
        account.endpoint_id, account.secret = made["id"], made["secret"]
        receivers.by_endpoint[account.id] = account
        self.history.accounts[account.id] = key
        self.history.endpoints[account.endpoint_id] = account.id
        self.history.balances_before[account.id] = int(me["credits"]["balance"])
        self.accounts.append(account)
        return account

    # the load itself

    async def run_for(self, seconds: float, *, every_s: float = 0.25) -> None:
        """Draw and start one action every `every_s` (each runs on its own, so a slow answer holds up nothing
        else), for `seconds`; then wait for the actions under way."""
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            account = self.rng.choice(self.accounts)
            action = self.rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
            task = asyncio.create_task(getattr(self, action)(account), name=f"{action}-{account.id}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(every_s * (0.5 + self.rng.random()))
        if self.tasks:
            await asyncio.gather(*self.tasks)

    def _job_body(self) -> dict[str, Any]:
        scenario = self.rng.choices(list(SCENARIOS), weights=list(SCENARIOS.values()))[0]
        params: dict[str, Any] = {"scenario": scenario, "render_s": round(self.rng.uniform(0.3, 3.0), 1),
                                  "clip": "tiny"}
        if scenario == "fail_then_succeed":
            params["failures"] = 1
        return {"model": "fake/default", "prompt": f"nemesis {scenario}", "duration_s": 1,
                "seed": self.rng.randrange(4), "params": params}

    async def create(self, account: Account) -> None:
        body = self._job_body()
        if self.rng.randrange(IMAGE_EVERY) == 0:
            upload = await self._upload(account)
            if upload is None:
                return
            body["input_image"] = upload
        status, job = await self.call(account, "create", "POST", "/v1/jobs", body=body)
        if status in (200, 201):
            self.history.acknowledged[job["id"]] = account.id
            account.jobs.append(job["id"])

    async def _upload(self, account: Account) -> str | None:
        status, upload = await self.call(account, "upload", "POST", "/v1/uploads", data=self.image)
        if status != 201:
            return None
        ends = time.monotonic() + CALL_WITHIN_S
        while upload.get("status") == "processing" and time.monotonic() < ends:
            await asyncio.sleep(0.3)
            status, upload = await self.call(account, "upload", "GET", f"/v1/uploads/{upload['id']}",
                                             idempotent=False)
        return upload["id"] if upload.get("status") == "ready" else None

    def _one_of(self, account: Account, *, completed: bool = False) -> str | None:
        """One of the account's jobs not deleted; with `completed`, one its endpoint heard had completed (a keep,
        an export or a rerun of anything else is refused 409, which tests little)."""
        done = self.receivers.completed if completed else None
        live = [j for j in account.jobs if j not in self.history.deleted and (done is None or j in done)]
        return self.rng.choice(live) if live else None

    async def cancel(self, account: Account) -> None:
        if (job_id := self._one_of(account)) is None:
            return
        status, _ = await self.call(account, "cancel", "POST", f"/v1/jobs/{job_id}/cancel")
        if 200 <= status < 300:
            self.history.canceled.add(job_id)

    async def delete(self, account: Account) -> None:
        if (job_id := self._one_of(account)) is None:
            return
        status, _ = await self.call(account, "delete", "DELETE", f"/v1/jobs/{job_id}")
        if 200 <= status < 300:
            self.history.deleted.add(job_id)

    async def rerun(self, account: Account) -> None:
        if (job_id := self._one_of(account, completed=self.rng.random() < 0.8)) is None:
            return
        status, job = await self.call(account, "rerun", "POST", f"/v1/jobs/{job_id}/rerun")
        if status in (200, 201):
            self.history.acknowledged[job["id"]] = account.id
            account.jobs.append(job["id"])

    async def keep(self, account: Account) -> None:
        if (job_id := self._one_of(account, completed=self.rng.random() < 0.8)) is not None:
            await self.call(account, "keep", "POST", f"/v1/jobs/{job_id}/keep")

    async def export(self, account: Account) -> None:
        if (job_id := self._one_of(account, completed=self.rng.random() < 0.8)) is not None:
            await self.call(account, "export", "POST", f"/v1/jobs/{job_id}/export", body={"url": self.export_url()})
