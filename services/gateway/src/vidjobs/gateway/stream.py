"""`GET /v1/jobs/{id}/stream`: Server-Sent Events, one `event: job` on connect and on every change.

A stream follows its job's feed (vidjobs.gateway.feeds): the job is read once per change per gateway process,
however many streams follow it, and a waiting job's places move with one read of its account's queue. A
stream only sends what its feed shows when it is new to this client, and writes a keepalive comment after 15 s
of silence; it has no other timer and reads nothing itself. A slow read delays what a stream shows and does
not end it; a stream that ends early anyway (a gateway restart, a broken connection) tells its client when to
come back, and the reconnect is sent the job as it stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
from aiohttp import web
from prometheus_client import Gauge

from vidjobs.common import waits
from vidjobs.common.states import TERMINAL
from vidjobs.gateway import feeds
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode
from vidjobs.gateway.feeds import Feed
from vidjobs.gateway.owned import found, job_id_of, view
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

_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a buffering proxy would hold events back until the stream closes
}


async def _send(resp: web.StreamResponse, gw: Gateway, job: OwnedJob) -> None:
    data = msgspec.json.encode(view(gw, job))
    # The id lets an EventSource say where it was (Last-Event-ID); a reconnect is sent the job as it stands
    # whatever it says, which is all a client needs to lose nothing.
    event_id = int(job.job.updated_at.timestamp() * 1000)
    await resp.write(b"id: %d\nevent: job\ndata: " % event_id + data + b"\n\n")


def _client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _follow(request: web.Request, resp: web.StreamResponse, feed: Feed, woken: asyncio.Event,
                  sent: OwnedJob) -> None:
    """Send the job whenever its feed shows something new, until it is terminal, deleted, the client leaves
    or we shut down; a keepalive comment after `KEEPALIVE_S` of silence."""
    gw = gateway(request)
    while sent.job.status not in TERMINAL and not _client_gone(request) and not gw.closing.is_set():
        if not await waits.set_within(woken, KEEPALIVE_S):
            await resp.write(b": keepalive\n\n")
            continue
        woken.clear()
        latest = feed.latest
        if latest is None:
            return  # deleted: nothing more will ever change
        if latest is not sent and _worth_sending(sent, latest):
            await _send(resp, gw, latest)
            sent = latest


def _worth_sending(sent: OwnedJob, latest: OwnedJob) -> bool:
    """Whether `latest` shows something the last job sent did not (vidjobs.gateway.feeds)."""
    return feeds.shown(latest) != feeds.shown(sent) or feeds.moved(sent, latest)


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
    gw, job_id = gateway(request), job_id_of(request)
    woken = asyncio.Event()  # set by the feed when the job shows something new, and at shutdown
    async with gw.feeds.follow(tenant(request).account_id, job_id, woken) as feed:
        job = found(await _first_read(gw, feed))
        resp = web.StreamResponse(headers=_HEADERS)
        await resp.prepare(request)
        try:
            await _send(resp, gw, job)
            await _follow(request, resp, feed, woken, job)
        except ConnectionResetError:
            pass  # the client left; nothing to answer
        except OSError as exc:
            # Headers are sent, so no error body is possible: end the stream with a hint of when to reconnect,
            # which an EventSource (and the SDK, the CLI, the page) follows by itself; the reconnect is sent
            # the job as it stands.
            log.warning("event stream ended early", extra={"job_id": job_id, "error": repr(exc)})
            with contextlib.suppress(OSError):
                await resp.write(f"retry: {RECONNECT_AFTER_S * 1000}\n\n".encode())
        return resp


async def _first_read(gw: Gateway, feed: Feed) -> OwnedJob | None:
    """The job as its feed first read it (or, for a job another stream here follows already, as it stands);
    a database that does not answer in time is a 503 before anything is sent, as for any read."""
    try:
        async with asyncio.timeout(gw.settings.db_call_timeout_s):
            await feed.read_once.wait()
    except TimeoutError as exc:
        raise ApiError(503, GatewayCode.UNAVAILABLE, "The job could not be read in time; try again shortly.",
                       retryable=True, headers={"Retry-After": str(RECONNECT_AFTER_S)}) from exc
    return feed.latest


ROUTES = [
    Route("GET", "/v1/jobs/{job_id}/stream", stream_job, "stream_job",
          "Server-Sent Events: `event: job` with the job on connect and on every change; closes when terminal",
          token_scope="read", responses={200: "text/event-stream", 401: ErrorOut, 404: ErrorOut, 429: ErrorOut}),
]
