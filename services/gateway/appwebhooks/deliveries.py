"""Delivering what happened to an account's jobs to its endpoints and to a job's own `webhook_url`.

A move that an app may hear of (states.app_events) puts `AppEventDue` in the outbox with the move. Its
consumer writes one delivery row per event type and destination that wants it (once, whatever the
redeliveries), and the deliverer sends due rows: the job as `GET /v1/jobs/{id}` shows it, under
`{"type", "timestamp", "data"}`, with the delivery id as `webhook-id`. A 2xx delivers it; 410 Gone disables
the endpoint (and whatever else waits for it); anything else is tried again after the next delay of
`VIDJOBS_APP_WEBHOOK_RETRY_S` (or the endpoint's `Retry-After`, if longer) until the schedule runs out.

Deliveries are claimed by pushing their due time out, so replicas share the work; at most a few of one URL
are in flight at once and each is cut at `VIDJOBS_APP_WEBHOOK_TIMEOUT_S`, so a slow or dead endpoint holds up
neither jobs (they never wait on a delivery) nor other endpoints.
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

from vidjobs.common import requestids
from vidjobs.common.events import AppEventDue
from vidjobs.common.runtime import Runtime
from vidjobs.gateway.appwebhooks import secrets
from vidjobs.gateway.appwebhooks.urls import UnsafeEndpoint
from vidjobs.providers import webhooks
from vidjobs.providers.http import retry_after

log = logging.getLogger("vidjobs.gateway.appwebhooks")

PER_URL_IN_FLIGHT = 4
MAX_IN_FLIGHT = 64
BATCH = 64
CLAIM_SLACK_S = 30.0  # a claimed delivery comes due again this long after its attempt should have ended


class Delivery(msgspec.Struct, kw_only=True):
    id: str
    account_id: str
    endpoint_id: str | None
    job_id: str
    event_type: str
    url: str
    attempts: int


# --- fan-out --------------------------------------------------------------------------------------------

_FAN_OUT = """
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
INSERT INTO webhook_deliveries (id, account_id, endpoint_id, job_id, event_type, event_key, url, next_attempt_at)
SELECT 'msg_' || md5(random()::text || clock_timestamp()::text), d.account_id, d.endpoint_id, $1, t.type, $2,
       d.url, clock_timestamp()
FROM destinations d CROSS JOIN unnest($3::text[]) AS t (type)
WHERE t.type = ANY (d.events)
ON CONFLICT DO NOTHING
"""


async def fan_out(pool: asyncpg.Pool, event: AppEventDue) -> int:
    """One delivery row per event type and destination that wants it; a redelivered event adds none."""
    status = await pool.execute(_FAN_OUT, event.job_id, event.key, event.types)
    return int(status.split()[-1])


# --- delivering -----------------------------------------------------------------------------------------

_CLAIM = """
WITH due AS (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY url ORDER BY next_attempt_at) AS nth
        FROM webhook_deliveries
        WHERE status = 'pending' AND next_attempt_at <= clock_timestamp() AND NOT (url = ANY ($4::text[]))
    ) d WHERE nth <= $2
    LIMIT $1
)
UPDATE webhook_deliveries w SET next_attempt_at = clock_timestamp() + make_interval(secs => $3),
                                updated_at = clock_timestamp()
FROM due WHERE w.id = due.id AND w.status = 'pending' AND w.next_attempt_at <= clock_timestamp()
RETURNING w.id, w.account_id, w.endpoint_id, w.job_id, w.event_type, w.url, w.attempts
"""


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
    """Sends due deliveries, up to MAX_IN_FLIGHT at once and a few to one URL (PER_URL_IN_FLIGHT, or up to
    twice that when a claim lands while some are under way), taking more as soon as any attempt ends: an
    attempt hanging until its timeout holds its own place and nothing else."""

    def __init__(self, rt: Runtime, session: aiohttp.ClientSession, job_body: JobBody):
        self._rt = rt
        self._session = session
        self._job_body = job_body
        self._wake = asyncio.Event()
        self._retries = rt.settings.app_webhook_retries()
        self._timeout_s = rt.settings.app_webhook_timeout_s
        self._in_flight: dict[str, int] = {}  # url -> attempts under way
        self._tasks: set[asyncio.Task] = set()

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
                try:
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                except TimeoutError:
                    pass
        finally:
            for task in self._tasks:
                task.cancel()

    def _start(self, delivery: Delivery) -> None:
        self._in_flight[delivery.url] = self._in_flight.get(delivery.url, 0) + 1
        task = asyncio.create_task(self._attempt_safely(delivery))
        self._tasks.add(task)

        def done(_: asyncio.Task) -> None:
            self._tasks.discard(task)
            left = self._in_flight.pop(delivery.url, 1) - 1
            if left:
                self._in_flight[delivery.url] = left
            self._wake.set()  # a place came free

        task.add_done_callback(done)

    async def _claim(self, limit: int) -> list[Delivery]:
        full = [url for url, n in self._in_flight.items() if n >= PER_URL_IN_FLIGHT]
        rows = await self._rt.pool.fetch(_CLAIM, limit, PER_URL_IN_FLIGHT, self._timeout_s + CLAIM_SLACK_S, full)
        return [msgspec.convert(dict(r), Delivery) for r in rows]

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
        if not keys:
            await _settle(self._rt.pool, delivery, Outcome(None, "the endpoint was removed", 0), "disabled", None)
            return
        outcome = await self._post(delivery, body, keys)
        status, due = self._next(delivery, outcome)
        await _settle(self._rt.pool, delivery, outcome, status, due)
        log.info("webhook delivery attempted", extra={
            "job_id": delivery.job_id, "delivery_id": delivery.id, "event": delivery.event_type,
            "endpoint_id": delivery.endpoint_id, "status": outcome.status, "error": outcome.error,
            "outcome": status})

    async def _post(self, delivery: Delivery, body: bytes, keys: list[str]) -> Outcome:
        headers = {**webhooks.signed_headers(keys, body, msg_id=delivery.id),
                   "Content-Type": "application/json", "User-Agent": "vidjobs-webhooks"}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s), self._session.post(
                    delivery.url, data=body, headers=headers, allow_redirects=False) as resp:
                await resp.read()
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


def _ms(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


async def _settle(pool: asyncpg.Pool, delivery: Delivery, outcome: Outcome, status: str, due_s: float | None) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            """
            UPDATE webhook_deliveries SET status = $2, attempts = attempts + 1, last_status = $3, last_error = $4,
                next_attempt_at = CASE WHEN $2 = 'pending' THEN clock_timestamp() + make_interval(secs => $5) END,
                updated_at = clock_timestamp()
            WHERE id = $1
            """,
            delivery.id, status, outcome.status, outcome.error, due_s or 0.0,
        )
        await conn.execute("INSERT INTO webhook_attempts (delivery_id, status, error, ms) VALUES ($1, $2, $3, $4)",
                           delivery.id, outcome.status, outcome.error, outcome.ms)
        if status == "disabled":
            await _gone(conn, delivery)


async def _gone(conn: asyncpg.Connection, delivery: Delivery) -> None:
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


