"""Delivering what happened to an account's jobs to its endpoints and to a job's own `webhook_url`.

A move that an app may hear of (states.app_events) puts `AppEventDue` in the outbox with the move. Its
consumer writes one delivery row per event type and destination that wants it (once, whatever the
redeliveries), and the deliverer sends due rows: the job as `GET /v1/jobs/{id}` shows it, under
`{"type", "timestamp", "data"}`, with the delivery id as `webhook-id`. A 2xx delivers it; 410 Gone disables
the endpoint (and whatever else waits for it); anything else is tried again after the next delay of
`VIDJOBS_APP_WEBHOOK_RETRY_S` (or the endpoint's `Retry-After`, if longer) until the schedule runs out.

Deliveries are claimed by pushing their due time out, so replicas share the work, each account and each host
within its share (claims.py); each attempt is cut at `VIDJOBS_APP_WEBHOOK_TIMEOUT_S` and reads at most
READ_LIMIT bytes of the answer, so a slow, dead or flooding endpoint holds up neither jobs (they never wait on
a delivery) nor other tenants' endpoints, and cannot fill the gateway's memory. Every attempt is counted,
even one whose outcome cannot be stored as it is, and one settling after its endpoint was deleted or
disabled leaves the delivery disabled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import aiohttp
import asyncpg
import msgspec
from asyncpg.pool import PoolConnectionProxy
from prometheus_client import Counter

from vidjobs.common import requestids, signatures
from vidjobs.common.events import AppEventDue
from vidjobs.common.runtime import Runtime
from vidjobs.common.waits import set_within
from vidjobs.gateway.appwebhooks import claims, secrets
from vidjobs.gateway.appwebhooks.claims import HOST_OF_URL, Delivery
from vidjobs.gateway.appwebhooks.urls import UnsafeEndpoint
from vidjobs.providers.http import retry_after

log = logging.getLogger("vidjobs.gateway.appwebhooks")

MAX_IN_FLIGHT = 64  # attempts under way in one replica
BATCH = 64
CLAIM_SLACK_S = 30.0  # a claimed delivery comes due again this long after its attempt should have ended
READ_LIMIT = 64 * 1024  # of an endpoint's answer; a longer one is cut off with its connection

# What the bound above lets in, as the gateway itself read it: an endpoint's count of what it sent says
# nothing of what we took, so this is where the bound is seen (and an endpoint flooding answers shows).
ANSWER_BYTES_READ = Counter("vidjobs_app_webhook_answer_bytes_read_total",
                            "Bytes of webhook endpoints' answers the gateway read; at most 64 KiB of each answer")


# --- fan-out --------------------------------------------------------------------------------------------

_FAN_OUT = f"""
WITH job AS (
    SELECT j.id, j.account_id, j.webhook_url, j.webhook_events FROM jobs j
    WHERE j.id = $1 AND j.deleted_at IS NULL
),
destinations AS (
    SELECT e.id AS endpoint_id, e.url, e.events, job.account_id FROM job
    JOIN webhook_endpoints e ON e.account_id = job.account_id AND e.deleted_at IS NULL AND e.disabled_at IS NULL
    UNION ALL
    SELECT NULL, job.webhook_url, job.webhook_events, job.account_id FROM job WHERE job.webhook_url IS NOT NULL
)
INSERT INTO webhook_deliveries (id, account_id, endpoint_id, job_id, event_type, event_key, url, host,
                                next_attempt_at)
SELECT 'msg_' || md5(random()::text || clock_timestamp()::text), d.account_id, d.endpoint_id, $1, t.type, $2,
       d.url, {HOST_OF_URL.format(url="d.url")}, clock_timestamp()
FROM destinations d CROSS JOIN unnest($3::text[]) AS t (type)
WHERE t.type = ANY (d.events)
ON CONFLICT DO NOTHING
"""


async def fan_out(pool: asyncpg.Pool, event: AppEventDue) -> int:
    """One delivery row per event type and destination that wants it; a redelivered event adds none."""
    status = await pool.execute(_FAN_OUT, event.job_id, event.key, event.types)
    return int(status.split()[-1])


# --- delivering -----------------------------------------------------------------------------------------

class Outcome(msgspec.Struct, frozen=True):
    status: int | None  # the HTTP status answered, None when none came
    error: str | None
    ms: int
    retry_after_s: float | None = None
    refused: bool = False  # the guard refused the URL: asking again would be refused again

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


JobBody = Callable[[str, str], Awaitable[bytes | None]]  # (account, job) -> the job's JSON, None if gone


class Deliverer:
    """Sends due deliveries, up to MAX_IN_FLIGHT at once, taking more as soon as any attempt ends: an attempt
    hanging until its timeout holds its own place and nothing else."""

    def __init__(self, rt: Runtime, session: aiohttp.ClientSession, job_body: JobBody):
        self._rt = rt
        self._session = session
        self._job_body = job_body
        self._wake = asyncio.Event()
        self._retries = rt.settings.app_webhook_retries()
        self._timeout_s = rt.settings.app_webhook_timeout_s
        self._caps = claims.Caps.of(rt.settings)
        self._tasks: set[asyncio.Task[None]] = set()

    def poke(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        failures = 0
        try:
            while not self._rt.stop.is_set():
                self._wake.clear()
                try:
                    room = MAX_IN_FLIGHT - len(self._tasks)
                    for delivery in (await self._claim(min(room, BATCH)) if room > 0 else []):
                        self._start(delivery)
                    failures = 0
                except Exception as exc:
                    # A database restarting or failing over: the deliveries wait in their rows meanwhile.
                    failures += 1
                    delay = min(0.5 * 2 ** min(failures, 6), 10.0)
                    log.warning("could not claim webhook deliveries; retrying",
                                extra={"error": repr(exc), "delay_s": delay})
                    await asyncio.sleep(delay)
                    continue
                await set_within(self._wake, 1.0)
        finally:
            for task in self._tasks:
                task.cancel()

    def _start(self, delivery: Delivery) -> None:
        task = asyncio.create_task(self._attempt_safely(delivery))
        self._tasks.add(task)

        def done(_: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._wake.set()  # a place came free

        task.add_done_callback(done)

    async def _claim(self, limit: int) -> list[Delivery]:
        return await claims.claim(self._rt.pool, self._caps, limit, self._timeout_s + CLAIM_SLACK_S)

    async def _attempt_safely(self, delivery: Delivery) -> None:
        try:
            await self._attempt(delivery)
        except Exception as exc:
            # Its claim runs out and it comes due again; nothing is lost.
            log.warning("webhook delivery could not be settled; it will be tried again",
                        extra={"delivery_id": delivery.id, "job_id": delivery.job_id, "error": repr(exc)})

    async def _attempt(self, delivery: Delivery) -> None:
        requestids.use(None)
        data = await self._job_body(delivery.account_id, delivery.job_id)
        if data is None:
            await _settle(self._rt.pool, delivery, Outcome(None, "the job was deleted", 0), "failed", None)
            return
        body = b'{"type":' + msgspec.json.encode(delivery.event_type) + b',"timestamp":' + msgspec.json.encode(
            datetime.now(UTC)) + b',"data":' + data + b"}"
        keys = await secrets.signing_secrets(self._rt, delivery.account_id, delivery.endpoint_id)
        if not keys:  # its endpoint was removed, or (a job's own URL) the account has no secret to sign with
            await _settle(self._rt.pool, delivery, Outcome(None, "no secret to sign it with", 0), "disabled", None)
            return
        outcome = await self._post(delivery, body, keys)
        status, due = self._next(delivery, outcome)
        try:
            status = await _settle(self._rt.pool, delivery, outcome, status, due)
        except (asyncpg.PostgresError, OSError, TimeoutError) as exc:
            # The attempt happened whatever the database made of its outcome: it is counted all the same,
            # and the delivery comes due when its claim runs out.
            await _count(self._rt.pool, delivery, outcome, f"could not be recorded: {exc!r}"[:500])
            raise
        log.info("webhook delivery attempted", extra={
            "job_id": delivery.job_id, "delivery_id": delivery.id, "event": delivery.event_type,
            "endpoint_id": delivery.endpoint_id, "status": outcome.status, "error": outcome.error,
            "outcome": status})

    async def _post(self, delivery: Delivery, body: bytes, keys: list[str]) -> Outcome:
        headers = {**signatures.signed_headers(keys, body, msg_id=delivery.id),
                   "Content-Type": "application/json", "User-Agent": "vidjobs-webhooks"}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s), self._session.post(
                    delivery.url, data=body, headers=headers, allow_redirects=False) as resp:
                await _read_prefix(resp)
                wait = retry_after(resp.headers.get("Retry-After"))
                return Outcome(resp.status, None, _ms(started), wait)
        except UnsafeEndpoint as exc:
            return Outcome(None, str(exc), _ms(started), refused=True)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:500], _ms(started))

    def _next(self, delivery: Delivery, outcome: Outcome) -> tuple[str, float | None]:
        """(its status from here, seconds until the next attempt when it stays pending)."""
        if outcome.delivered:
            return "delivered", None
        if outcome.status == 410:
            return "disabled", None
        if outcome.refused:
            return "failed", None
        done = delivery.attempts + 1
        if done > len(self._retries):
            return "failed", None
        return "pending", max(self._retries[done - 1], outcome.retry_after_s or 0.0)


async def _read_prefix(resp: aiohttp.ClientResponse) -> None:
    """Read at most READ_LIMIT bytes of the answer; a longer one is cut off, with its connection, so an
    endpoint can neither fill our memory nor hold the connection while it streams."""
    left = READ_LIMIT
    while left > 0:
        chunk = await resp.content.read(left)
        if not chunk:
            return
        ANSWER_BYTES_READ.inc(len(chunk))
        left -= len(chunk)
    if not resp.content.at_eof():
        resp.close()


def _ms(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


# A settle changes a delivery only while it is still pending; one whose endpoint was deleted or disabled
# while the attempt was under way becomes disabled, whatever the attempt's outcome.
_SETTLE = """
WITH decided AS (
    SELECT CASE WHEN d.status <> 'pending' THEN d.status
                WHEN e.deleted_at IS NOT NULL OR e.disabled_at IS NOT NULL THEN 'disabled'
                ELSE $2 END AS status
    FROM webhook_deliveries d LEFT JOIN webhook_endpoints e ON e.id = d.endpoint_id
    WHERE d.id = $1
)
UPDATE webhook_deliveries d SET status = decided.status, attempts = d.attempts + 1, last_status = $3,
    last_error = $4, claimed_until = NULL, updated_at = clock_timestamp(),
    next_attempt_at = CASE WHEN decided.status = 'pending' THEN clock_timestamp() + make_interval(secs => $5) END
FROM decided WHERE d.id = $1
RETURNING d.status
"""
_ATTEMPT = "INSERT INTO webhook_attempts (delivery_id, account_id, status, error, ms) VALUES ($1, $2, $3, $4, $5)"


async def _settle(pool: asyncpg.Pool, delivery: Delivery, outcome: Outcome, status: str,
                  due_s: float | None) -> str:
    """Record the attempt and the delivery's status from here; returns the status it now has."""
    async with pool.acquire() as conn, conn.transaction():
        settled = await conn.fetchval(_SETTLE, delivery.id, status, outcome.status, outcome.error, due_s or 0.0)
        await conn.execute(_ATTEMPT, delivery.id, delivery.account_id, outcome.status, outcome.error, outcome.ms)
        if outcome.status == 410 and settled == "disabled":
            await _gone(conn, delivery)
    return str(settled)


async def _count(pool: asyncpg.Pool, delivery: Delivery, outcome: Outcome, error: str) -> None:
    """The attempt alone, when its outcome could not be settled: the delivery stays due at its claim's end."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = $2, "
                           "last_error = $3, claimed_until = NULL, updated_at = clock_timestamp() WHERE id = $1",
                           delivery.id, outcome.status, error)
        await conn.execute(_ATTEMPT, delivery.id, delivery.account_id, outcome.status, error, outcome.ms)


async def _gone(conn: PoolConnectionProxy[asyncpg.Record], delivery: Delivery) -> None:
    """410 Gone: the destination wants nothing more; what else waits for it will not be sent."""
    if delivery.endpoint_id is not None:
        await conn.execute(
            "UPDATE webhook_endpoints SET disabled_at = clock_timestamp(), disabled_reason = $2 "
            "WHERE id = $1 AND disabled_at IS NULL", delivery.endpoint_id, "the endpoint answered 410 Gone")
        await conn.execute("UPDATE webhook_deliveries SET status = 'disabled', next_attempt_at = NULL "
                           "WHERE endpoint_id = $1 AND status = 'pending'", delivery.endpoint_id)
        log.warning("webhook endpoint answered 410 Gone; disabled", extra={"endpoint_id": delivery.endpoint_id})
        return
    await conn.execute("UPDATE webhook_deliveries SET status = 'disabled', next_attempt_at = NULL "
                       "WHERE job_id = $1 AND endpoint_id IS NULL AND status = 'pending'", delivery.job_id)




PRUNE_BATCH = 1000


async def prune(pool: asyncpg.Pool, retention_days: float) -> int:
    """Delete finished deliveries (and their attempts) last changed longer ago than `retention_days`, in
    batches; how many went. Pending ones stay whatever their age: their schedule ends them."""
    removed = 0
    while True:
        status = await pool.execute(
            """
            DELETE FROM webhook_deliveries WHERE id IN (
                SELECT id FROM webhook_deliveries
                WHERE status <> 'pending' AND updated_at < clock_timestamp() - make_interval(secs => $1 * 86400)
                ORDER BY updated_at LIMIT $2)
            """, retention_days, PRUNE_BATCH)
        count = int(status.split()[-1])
        removed += count
        if count < PRUNE_BATCH:
            return removed
