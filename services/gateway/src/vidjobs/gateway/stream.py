"""`GET /v1/jobs/{id}/stream`: Server-Sent Events, one `event: job` on connect and on every change.

A change notification only says "look again": the stream rereads the job (through the caller's Tenant),
exactly like every other consumer, so a lost or repeated notification cannot show a wrong state. A slow
reread at every keepalive covers notifications that never arrive (core NATS delivers at most once). A
waiting job's place moves when another job of its account leaves the queue, or an interactive one joins
ahead of a batch one (lanes): that move sends one hint for the account's queue (changes.note_queue), which
the streams of its waiting jobs listen for, so a waiting job is reread when its place may have moved and
not on a timer of its own; it is sent only when what it shows has changed.

A waiting job's estimate (vidjobs.common.estimates) moves with other accounts' queues and with the renders in
flight, which no hint of its account announces: every `estimate_refresh_s` the stream makes it again from the
reads the whole process shares (one per provider and interval, however many streams are open), without
reading the job, and sends the job only when the estimate moved by more than its rounding or a job ahead
left (`estimates.moved`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from datetime import UTC, datetime

import asyncpg
import msgspec
import nats.errors
from aiohttp import web
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Gauge

from vidjobs.common import estimates, events
from vidjobs.common.states import TERMINAL, JobStatus
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode
from vidjobs.gateway.owned import job_id_of, owned_or_404, view
from vidjobs.gateway.processcaps import StreamsFull
from vidjobs.gateway.routetable import Route
from vidjobs.gateway.state import API_KEY_ID, Gateway, gateway
from vidjobs.gateway.tenant import OwnedJob, tenant

log = logging.getLogger("vidjobs.gateway.stream")

# Per gateway process (each holds its own streams): sum across replicas.
STREAMS_OPEN = Gauge("vidjobs_sse_streams_open", "Server-Sent Event streams this gateway is holding open")

KEEPALIVE_S = 15.0
STREAMS_RETRY_AFTER_S = 5
RECONNECT_AFTER_S = 5  # a stream ended by a dependency that failed: when its client should come back
_TIMER_SLACK_S = 0.005  # asyncio may wake a timer this early; still the keepalive's turn

_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a buffering proxy would hold events back until the stream closes
}


class Tick(enum.Enum):
    CHANGED = "changed"
    QUIET = "quiet"
    CLOSING = "closing"


async def _next_tick(changed: asyncio.Event, closing: asyncio.Event, quiet_s: float) -> Tick:
    waits = {asyncio.ensure_future(changed.wait()): Tick.CHANGED,
             asyncio.ensure_future(closing.wait()): Tick.CLOSING}
    try:
        done, _ = await asyncio.wait(waits, timeout=quiet_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    if any(waits[t] is Tick.CLOSING for t in done):
        return Tick.CLOSING
    changed.clear()
    return Tick.CHANGED if done else Tick.QUIET


async def _send(resp: web.StreamResponse, gw: Gateway, job: OwnedJob) -> None:
    data = msgspec.json.encode(view(gw, job))
    await resp.write(b"event: job\ndata: " + data + b"\n\n")


def _shown(job: OwnedJob) -> tuple[object, ...]:
    """What the job's JSON shows, the estimate aside: every stored change moves `updated_at`, and the queue
    position is made at read time. The signed URLs are left out: they are new at every read, which is not a
    change."""
    return job.job.status, job.job.updated_at, job.waiting_position


def _worth_sending(sent: OwnedJob, latest: OwnedJob) -> bool:
    """Whether `latest` shows something the last job sent did not; an estimate that only drifted within its
    rounding is not news (compared with what was sent, so small drifts cannot add up unseen)."""
    return _shown(latest) != _shown(sent) or estimates.moved(sent.estimate, latest.estimate, datetime.now(UTC))


def _client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _follow(request: web.Request, resp: web.StreamResponse, job: OwnedJob, changed: asyncio.Event,
                  queue: Subscription) -> None:
    """Send the job whenever it changes, until it is terminal, deleted, the client leaves or we shut down.
    `queue` (its account's queue hints) is dropped once the job no longer waits."""
    gw, owner = gateway(request), tenant(request)
    loop = asyncio.get_running_loop()
    keepalive_at = loop.time() + KEEPALIVE_S  # unless something else is written first
    sent = job
    while job.job.status not in TERMINAL and not _client_gone(request):
        quiet_s = max(0.0, keepalive_at - loop.time())
        if job.job.status is JobStatus.PENDING:
            quiet_s = min(quiet_s, gw.settings.estimate_refresh_s)  # its estimate is made again this often
        tick = await _next_tick(changed, gw.closing, quiet_s)
        if tick is Tick.CLOSING:
            return
        keepalive = tick is Tick.QUIET and loop.time() >= keepalive_at - _TIMER_SLACK_S
        if keepalive:
            await resp.write(b": keepalive\n\n")
            keepalive_at = loop.time() + KEEPALIVE_S
        if tick is Tick.QUIET and not keepalive:
            latest: OwnedJob | None = await owner.estimated(job)  # the estimate only, from the shared reads
        else:
            latest = await owner.job(job.job.id)
        if latest is None:
            return  # deleted: nothing more will ever change
        if latest.job.status is not JobStatus.PENDING and job.job.status is JobStatus.PENDING:
            with contextlib.suppress(nats.errors.Error):
                await queue.unsubscribe()
        if _worth_sending(sent, latest):
            await _send(resp, gw, latest)
            keepalive_at = loop.time() + KEEPALIVE_S
            sent = latest
        job = latest


def _streams_full(full: StreamsFull) -> ApiError:
    return ApiError(429, GatewayCode.LIMIT_REACHED,
                    f"{full.limit} event streams are already open for this {full.scope}, the limit; close one (a "
                    "stream ends by itself when its job finishes) or follow several jobs by polling GET /v1/jobs",
                    retryable=True, headers={"Retry-After": str(STREAMS_RETRY_AFTER_S)})


async def stream_job(request: web.Request) -> web.StreamResponse:
    """Holds one of the account's and the key's stream places (limits.StreamSlots) while it is open."""
    slots, account_id, key_id = gateway(request).streams, tenant(request).account_id, request[API_KEY_ID]
    try:
        slots.take(account_id, key_id)
    except StreamsFull as full:
        raise _streams_full(full) from full
    try:
        with STREAMS_OPEN.track_inprogress():
            return await _stream(request)
    finally:
        slots.give_back(account_id, key_id)


async def _stream(request: web.Request) -> web.StreamResponse:
    gw = gateway(request)
    changed = asyncio.Event()

    async def on_change(_: Msg) -> None:
        changed.set()

    # Subscribe before the first read, so a change between the two cannot be missed.
    nc = gw.rt.nc
    subs = [await nc.subscribe(f"{events.CHANGED_PREFIX}.{job_id_of(request)}", cb=on_change),
            await nc.subscribe(f"{events.QUEUE_PREFIX}.{tenant(request).account_id}", cb=on_change)]
    try:
        job = await owned_or_404(request)
        resp = web.StreamResponse(headers=_HEADERS)
        await resp.prepare(request)
        try:
            await _send(resp, gw, job)
            await _follow(request, resp, job, changed, subs[1])
        except ConnectionResetError:
            pass  # the client left; nothing to answer
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # Headers are sent, so no error body is possible: end the stream with a hint of when to reconnect
            # (a database that stopped answering, a restart), which an EventSource follows by itself.
            log.warning("event stream ended early", extra={"job_id": job.job.id, "error": repr(exc)})
            with contextlib.suppress(OSError):
                await resp.write(f"retry: {RECONNECT_AFTER_S * 1000}\n\n".encode())
        return resp
    finally:
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):  # dropped already, or by a closed connection
                await sub.unsubscribe()


ROUTES = [
    Route("GET", "/v1/jobs/{job_id}/stream", stream_job, "stream_job",
          "Server-Sent Events: `event: job` with the job on connect and on every change; closes when terminal",
          token_scope="read", responses={200: "text/event-stream", 401: ErrorOut, 404: ErrorOut, 429: ErrorOut}),
]
