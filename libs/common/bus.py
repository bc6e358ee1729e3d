"""JetStream plumbing: the streams, durable pull consumers, and the loop that turns a handler's outcome into
ack, delayed nak or termination in one place."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError

from libs.common import events, metrics
from libs.common.errors import Redeliver
from libs.common.events import Event

log = logging.getLogger("vidjobs.bus")

WORK_STREAM = "VIDJOBS_WORK"
CHANGES_STREAM = "VIDJOBS_CHANGES"
DEAD_STREAM = "VIDJOBS_DEAD"
DEAD_PREFIX = "vidjobs.dead"

_STREAMS = [
    # Work: each subject has exactly one durable consumer; a message leaves once it is acked.
    StreamConfig(
        name=WORK_STREAM, subjects=["vidjobs.work.>"], retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE, duplicate_window=120.0, discard=DiscardPolicy.OLD,
    ),
    # Change notifications for progress displays: short-lived, fanned out, never the source of truth.
    StreamConfig(
        name=CHANGES_STREAM, subjects=[f"{events.CHANGED_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, max_age=600.0, max_msgs_per_subject=16, duplicate_window=120.0,
    ),
    # Messages that could not be handled within their delivery budget, kept for a person to inspect.
    StreamConfig(
        name=DEAD_STREAM, subjects=[f"{DEAD_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, max_age=14 * 86400.0,
    ),
]


async def connect(url: str, name: str) -> tuple[NATS, JetStreamContext]:
    nc = await nats.connect(
        url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=5,
    )
    return nc, nc.jetstream(timeout=10)


def stream_configs(replicas: int = 1) -> list[StreamConfig]:
    return [dataclasses.replace(c, num_replicas=replicas) for c in _STREAMS]


async def ensure_streams(js: JetStreamContext, *, replicas: int = 1) -> None:
    for config in stream_configs(replicas):
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)


@dataclass(frozen=True)
class Delivery:
    """What a handler may know about the message it was handed."""

    attempt: int  # 1 on first delivery
    subject: str


Handler = Callable[[Event, Delivery], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerSpec:
    durable: str
    subject: str
    handler: Handler
    concurrency: int = 8
    ack_wait_s: float = 30.0
    # Handler failures before the message is dead-lettered. Deferrals (Redeliver) are not failures: a job
    # held back by a provider's limits may wait through many deliveries, so the server itself never stops
    # redelivering short of DELIVERY_CEILING.
    max_deliver: int = 20
    # Deferred messages (nak with delay) stay ack-pending; a consumer that defers many must allow many.
    max_ack_pending: int | None = None
    on_dead: Callable[[Event], Awaitable[None]] | None = None


DELIVERY_CEILING = 100_000


class FailureCounts:
    """Handler failures per message (by stream sequence) seen by this process."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def add(self, msg: Msg) -> int:
        seq = msg.metadata.sequence.stream
        self._counts[seq] = self._counts.get(seq, 0) + 1
        return self._counts[seq]

    def forget(self, msg: Msg) -> None:
        self._counts.pop(msg.metadata.sequence.stream, None)


def retry_delay(attempt: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * 2 ** (attempt - 1)))


async def consume(js: JetStreamContext, spec: ConsumerSpec, stop: asyncio.Event) -> None:
    config = ConsumerConfig(
        durable_name=spec.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=spec.ack_wait_s,
        max_deliver=DELIVERY_CEILING, max_ack_pending=spec.max_ack_pending or spec.concurrency * 4,
        filter_subject=spec.subject,
    )
    psub = await js.pull_subscribe(spec.subject, durable=spec.durable, stream=WORK_STREAM, config=config)
    slots = asyncio.Semaphore(spec.concurrency)
    failures = FailureCounts()
    inflight: set[asyncio.Task] = set()
    while not stop.is_set():
        await slots.acquire()
        free = 1
        while free < spec.concurrency and not slots.locked():
            await slots.acquire()
            free += 1
        try:
            msgs = await psub.fetch(free, timeout=1.0)
        except (TimeoutError, nats.errors.TimeoutError):
            msgs = []
        except nats.errors.Error as exc:
            log.warning("fetch failed", extra={"consumer": spec.durable, "error": repr(exc)})
            msgs = []
            await asyncio.sleep(0.5)
        for _ in range(free - len(msgs)):
            slots.release()
        for msg in msgs:
            task = asyncio.create_task(_handle(spec, msg, slots, failures))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.wait(inflight, timeout=spec.ack_wait_s)
    with contextlib.suppress(Exception):
        await psub.unsubscribe()


async def _heartbeat(msg: Msg, every: float) -> None:
    # Long work tells JetStream it is alive, so the message is not redelivered to another worker.
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def _handle(spec: ConsumerSpec, msg: Msg, slots: asyncio.Semaphore, failures: FailureCounts) -> None:
    started = time.perf_counter()
    try:
        await _dispatch(spec, msg, failures)
    finally:
        slots.release()
        metrics.HANDLE_SECONDS.labels(spec.durable).observe(time.perf_counter() - started)


async def _dispatch(spec: ConsumerSpec, msg: Msg, failures: FailureCounts) -> None:
    attempt = msg.metadata.num_delivered
    try:
        event = events.decode(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("poison message: cannot decode", extra={"consumer": spec.durable, "error": str(exc)})
        await _dead_letter(spec, msg, None, f"undecodable: {exc}")
        return
    beat = asyncio.create_task(_heartbeat(msg, spec.ack_wait_s / 3))
    try:
        await spec.handler(event, Delivery(attempt=attempt, subject=msg.subject))
    except Redeliver as again:
        metrics.MESSAGES.labels(spec.durable, "deferred").inc()
        await msg.nak(delay=again.delay)
        return
    except Exception as exc:
        job_id = getattr(event, "job_id", None)
        failed = failures.add(msg)
        if failed >= spec.max_deliver or attempt >= DELIVERY_CEILING:
            log.exception("handler failed for the last time", extra={"consumer": spec.durable, "job_id": job_id})
            failures.forget(msg)
            await _dead_letter(spec, msg, event, repr(exc))
            return
        delay = retry_delay(failed)
        log.warning("handler failed; will be redelivered", exc_info=True,
                    extra={"consumer": spec.durable, "job_id": job_id, "attempt": attempt, "delay_s": delay})
        metrics.MESSAGES.labels(spec.durable, "failed").inc()
        await msg.nak(delay=delay)
        return
    finally:
        beat.cancel()
    failures.forget(msg)
    await msg.ack()
    metrics.MESSAGES.labels(spec.durable, "acked").inc()


async def _dead_letter(spec: ConsumerSpec, msg: Msg, event: Event | None, why: str) -> None:
    metrics.MESSAGES.labels(spec.durable, "dead").inc()
    js = msg._client.jetstream()
    await js.publish(
        f"{DEAD_PREFIX}.{spec.durable}", msg.data,
        headers={"Vidjobs-Dead-Reason": why[:500], "Vidjobs-Original-Subject": msg.subject},
    )
    if event is not None and spec.on_dead is not None:
        await spec.on_dead(event)
    await msg.term()
