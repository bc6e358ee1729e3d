"""JetStream plumbing: the streams, durable pull consumers, and the loop that turns a handler's outcome into
ack, delayed nak or termination in one place."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar, cast

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
from nats.js.errors import BadRequestError, NotFoundError

from vidjobs.common import backoff, events, faults, metrics, requestids, tracing
from vidjobs.common.errors import GiveUp, Redeliver
from vidjobs.common.events import Event, WorkEvent

log = logging.getLogger("vidjobs.bus")

WORK_STREAM = "VIDJOBS_WORK"
# Earlier versions stored job change hints in this stream; they are core NATS messages now (`changes`), and a
# stream left capturing their subjects would still write each one to disk.
OBSOLETE_STREAMS = ("VIDJOBS_CHANGES",)
DEAD_STREAM = "VIDJOBS_DEAD"
DEAD_PREFIX = "vidjobs.dead"

_STREAMS = [
    # Work: each subject has exactly one durable consumer; a message leaves once it is acked.
    StreamConfig(
        name=WORK_STREAM, subjects=["vidjobs.work.>"], retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE, duplicate_window=120.0, discard=DiscardPolicy.OLD,
    ),
    # Messages that could not be handled within their delivery budget, kept for a person to inspect.
    StreamConfig(
        name=DEAD_STREAM, subjects=[f"{DEAD_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, max_age=14 * 86400.0,
    ),
]


async def connect(url: str, name: str, *, ping_interval_s: float = 3.0,
                  max_outstanding_pings: int = 2) -> tuple[NATS, JetStreamContext]:
    """`url` may name several servers of one cluster, comma-separated; the client also learns the others
    from the server it reaches, and moves between them on its own. A server that stops answering without
    closing the connection (frozen, or a half-open link) is noticed by its unanswered pings: after
    `max_outstanding_pings` of them, one `ping_interval_s` apart, the client reconnects (the library's
    defaults, two minutes apart, would leave a service talking to a frozen server for minutes)."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    nc = await nats.connect(
        servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=5,
        ping_interval=ping_interval_s, max_outstanding_pings=max_outstanding_pings,
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
    for name in OBSOLETE_STREAMS:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)


@dataclass(frozen=True)
class Delivery:
    """What a handler may know about the message it was handed."""

    # 1 on the first handling of this work; then 1 + the handlings before it that failed or died with their
    # process. Deferrals (Redeliver, infrastructure faults) do not count. Survives restarts (see `Tries`).
    attempt: int
    subject: str


E = TypeVar("E", bound=WorkEvent)
# A handler takes the events of its own subject (events.SUBJECT_EVENTS), already decoded.
Handler = Callable[[E, Delivery], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerSpec(Generic[E]):
    durable: str
    subject: str
    handler: Handler[E]
    concurrency: int = 8
    ack_wait_s: float = 30.0
    # Handlings that failed or killed their process before the message is dead-lettered. Deferrals
    # (Redeliver) and infrastructure faults are not failures: a job held back by a provider's limits may be
    # deferred for hours.
    max_deliver: int = 20
    on_dead: Callable[[Event], Awaitable[None]] | None = None
    # Where the pull loop reports itself, for the service's /readyz.
    pulls: Pulls | None = None

    def __post_init__(self) -> None:
        if self.subject not in events.SUBJECT_EVENTS:
            raise ValueError(f"{self.subject} is not a work subject; see events.SUBJECT_EVENTS")


@dataclass
class Pulls:
    """The state of one consumer's pull loop in this process: a loop that ended, never got its subscription,
    or hangs in one pull takes nothing from JetStream although the process looks alive."""

    subscribed: bool = False
    ended: bool = False
    pulling_since: float | None = None  # monotonic start of the pull in progress

    def problem(self, stuck_after_s: float) -> str | None:
        if self.ended:
            return "stopped"
        if not self.subscribed:
            return "not subscribed"
        if self.pulling_since is not None and time.monotonic() - self.pulling_since > stuck_after_s:
            return "stuck in a pull"
        return None


# Headers of a deferred message's copy. A deferral acks the message and publishes a copy that carries the
# count of failed handlings so far, so JetStream's own delivery count of the copy only ever grows by
# failures and by deliveries that died with their process, and the count survives any restart.
TRIES_HEADER = "Vidjobs-Tries"  # failed or lost handlings before this copy
NOT_BEFORE_HEADER = "Vidjobs-Not-Before"  # unix seconds; an earlier delivery is held back once, in place
STREAK_HEADER = "Vidjobs-Fault-Streak"  # consecutive infrastructure faults, for their backoff
_OWN_HEADERS = {TRIES_HEADER, NOT_BEFORE_HEADER, STREAK_HEADER, "Nats-Msg-Id"}
# JetStream stops delivering a message past this many deliveries of one copy and says so in an advisory;
# it is a backstop only, since `Tries` dead-letters first.
BACKSTOP_SLACK = 3


@dataclass(frozen=True)
class Tries:
    """How often the work in a message has been tried, read from the copy and JetStream's count of it."""

    before: int  # failed or lost handlings before this delivery
    streak: int  # consecutive infrastructure faults before this delivery
    not_before: float | None

    @classmethod
    def of(cls, msg: Msg) -> Tries:
        headers = msg.headers or {}
        not_before = float(headers[NOT_BEFORE_HEADER]) if NOT_BEFORE_HEADER in headers else None
        earlier = msg.metadata.num_delivered - 1
        if not_before is not None and earlier > 0:
            earlier -= 1  # its first delivery may have been held until `not_before`
        return cls(before=int(headers.get(TRIES_HEADER, 0)) + earlier,
                   streak=int(headers.get(STREAK_HEADER, 0)), not_before=not_before)


# The most messages JetStream lets one consumer have out at once, across all its replicas together. It is not
# what bounds the work: each process fetches only as many messages as it has free handlers (`concurrency`),
# so every replica adds handlers. But a message handed back with a delay (a retry's backoff, a deferred copy
# held until it is due, a recovery check waiting for its hour) counts against it for the whole wait, one per
# live job at most: the window holds them all, or a few jobs waiting would stop every other job on the subject.
ACK_WINDOW = 1_000_000


def consumer_config(spec: ConsumerSpec[E]) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=spec.ack_wait_s,
        max_deliver=spec.max_deliver + BACKSTOP_SLACK, max_ack_pending=ACK_WINDOW, filter_subject=spec.subject,
    )


async def _subscribe(js: JetStreamContext, spec: ConsumerSpec[E], stop: asyncio.Event) -> Any:
    """The pull subscription, waiting out a JetStream that is electing a leader or not there yet. The
    consumer is created or brought up to this spec (an older deployment's keeps its durable state)."""
    failures = 0
    while True:
        try:
            try:
                await js.add_consumer(WORK_STREAM, config=consumer_config(spec))
            except BadRequestError as exc:
                log.warning("consumer kept its old settings", extra={"consumer": spec.durable, "error": repr(exc)})
            return await js.pull_subscribe_bind(durable=spec.durable, stream=WORK_STREAM)
        except (nats.errors.Error, TimeoutError) as exc:
            failures += 1
            if stop.is_set():
                raise
            log.warning("consumer not ready; retrying", extra={"consumer": spec.durable, "error": repr(exc)})
            await asyncio.sleep(min(0.25 * 2 ** failures, 5.0))


async def consume(js: JetStreamContext, spec: ConsumerSpec[E], stop: asyncio.Event) -> None:
    pulls = spec.pulls or Pulls()
    try:
        await _pull_loop(js, spec, stop, pulls)
    finally:
        pulls.ended = True


async def _pull_loop(js: JetStreamContext, spec: ConsumerSpec[E], stop: asyncio.Event, pulls: Pulls) -> None:
    psub = await _subscribe(js, spec, stop)
    backstop = await js._nc.subscribe(f"{MAX_DELIVERIES_ADVISORY}.{WORK_STREAM}.{spec.durable}",
                                      cb=partial(_on_max_deliveries, js, spec))
    pulls.subscribed = True
    try:
        await _pull(js, spec, stop, pulls, psub)
    finally:
        # Also when cancelled mid-fetch: a pull subscription left open makes the connection's drain at exit
        # wait out its whole timeout.
        with contextlib.suppress(Exception):
            await psub.unsubscribe()
            await backstop.unsubscribe()


async def _pull(js: JetStreamContext, spec: ConsumerSpec[E], stop: asyncio.Event, pulls: Pulls, psub: Any) -> None:
    slots = asyncio.Semaphore(spec.concurrency)
    inflight: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        await slots.acquire()
        free = 1
        while free < spec.concurrency and not slots.locked():
            await slots.acquire()
            free += 1
        pulls.pulling_since = time.monotonic()
        try:
            msgs = await psub.fetch(free, timeout=1.0)
        except (TimeoutError, nats.errors.TimeoutError):
            msgs = []
        except nats.errors.Error as exc:
            log.warning("fetch failed", extra={"consumer": spec.durable, "error": repr(exc)})
            msgs = []
            await asyncio.sleep(0.5)
        pulls.pulling_since = None
        for _ in range(free - len(msgs)):
            slots.release()
        for msg in msgs:
            task = asyncio.create_task(_handle(js, spec, msg, slots))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.wait(inflight, timeout=spec.ack_wait_s)


async def _heartbeat(msg: Msg, every: float) -> None:
    # Long work tells JetStream it is alive, so the message is not redelivered to another worker.
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def _handle(js: JetStreamContext, spec: ConsumerSpec[E], msg: Msg, slots: asyncio.Semaphore) -> None:
    started = time.perf_counter()
    try:
        with metrics.IN_HANDLING.labels(spec.durable).track_inprogress():
            await _dispatch(js, spec, msg)
    except Exception as exc:
        # The answer to JetStream (ack, nak, a deferral's copy, a dead letter) did not get through: the
        # message comes back after its ack wait, and the handlers are safe to run again.
        log.warning("could not settle a message; it will be redelivered",
                    extra={"consumer": spec.durable, "error": repr(exc)})
    finally:
        slots.release()
        metrics.HANDLE_SECONDS.labels(spec.durable).observe(time.perf_counter() - started)


async def _dispatch(js: JetStreamContext, spec: ConsumerSpec[E], msg: Msg) -> None:
    tries = Tries.of(msg)
    if tries.not_before is not None and msg.metadata.num_delivered == 1 and tries.not_before > time.time():
        await msg.nak(delay=tries.not_before - time.time())  # a deferred copy, early: hold it back
        return
    try:
        # The consumer's subject carries E and nothing else (events.SUBJECT_EVENTS, checked when the spec was
        # made), and decoding refuses any other event: what comes back is an E.
        event = cast(E, events.decode(msg.subject, msg.data))
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
        log.error("poison message: cannot decode", extra={"consumer": spec.durable, "error": str(exc)})
        await _dead_letter(js, spec, msg, None, f"undecodable: {exc}")
        return
    job_id = getattr(event, "job_id", None)
    if tries.before >= spec.max_deliver:
        # Earlier handlings failed or took their process down with them: do not offer it another.
        log.error("message gave up: its handlings kept failing or dying",
                  extra={"consumer": spec.durable, "job_id": job_id, "tries": tries.before})
        await _dead_letter(js, spec, msg, event, f"{tries.before} handlings failed or died with their process")
        return
    beat = asyncio.create_task(_heartbeat(msg, spec.ack_wait_s / 3))
    # This task handles this one message: the request that caused it is the request being worked on.
    requestids.use((msg.headers or {}).get(requestids.MESSAGE_HEADER))
    try:
        with tracing.handling_span(f"handle {spec.durable}", **{"messaging.destination.name": msg.subject,
                                   "vidjobs.job_id": job_id, "vidjobs.attempt": tries.before + 1}):
            await spec.handler(event, Delivery(attempt=tries.before + 1, subject=msg.subject))
    except GiveUp as hopeless:
        await _dead_letter(js, spec, msg, event, f"gave up: {hopeless}")
        return
    except Redeliver as again:
        if again.counts:
            await _redeliver(js, spec, msg, event, tries, again)
            return
        metrics.MESSAGES.labels(spec.durable, "deferred").inc()
        await _defer(js, msg, tries, again.delay, streak=0)
        return
    except Exception as exc:
        await _failed(js, spec, msg, event, tries, exc)
        return
    finally:
        beat.cancel()
    await msg.ack()
    metrics.MESSAGES.labels(spec.durable, "acked").inc()


async def _failed(js: JetStreamContext, spec: ConsumerSpec[E], msg: Msg, event: Event, tries: Tries,
                  exc: Exception) -> None:
    job_id = getattr(event, "job_id", None)
    if faults.is_infrastructure(exc):
        delay = backoff.delay(tries.streak + 1, base=0.5, cap=30.0)
        log.warning("infrastructure fault; work deferred", extra={
            "consumer": spec.durable, "job_id": job_id, "error": repr(exc), "delay_s": delay})
        metrics.MESSAGES.labels(spec.durable, "fault").inc()
        await _defer(js, msg, tries, delay, streak=tries.streak + 1)
        return
    failed = tries.before + 1
    if failed >= spec.max_deliver:
        log.exception("handler failed for the last time", extra={"consumer": spec.durable, "job_id": job_id})
        await _dead_letter(js, spec, msg, event, repr(exc))
        return
    delay = backoff.delay(failed)
    log.warning("handler failed; will be redelivered", exc_info=True,
                extra={"consumer": spec.durable, "job_id": job_id, "attempt": failed, "delay_s": delay})
    metrics.MESSAGES.labels(spec.durable, "failed").inc()
    await _spend(js, msg, tries, delay)


async def _spend(js: JetStreamContext, msg: Msg, tries: Tries, delay: float) -> None:
    """One try spent; the work comes back after `delay`. Usually JetStream's count of this copy records it
    (a nak). On the first delivery of a deferred copy, which the count cannot tell from a held-back one, a
    new copy carries the count instead."""
    if tries.not_before is not None and msg.metadata.num_delivered == 1:
        await _defer(js, msg, Tries(before=tries.before + 1, streak=0, not_before=None), delay, streak=0)
        return
    await msg.nak(delay=max(delay, 0.0))


async def _redeliver(js: JetStreamContext, spec: ConsumerSpec[E], msg: Msg, event: Event, tries: Tries,
                     again: Redeliver) -> None:
    """A handling that failed in a way its handler expected: one try spent, redelivered after its delay."""
    if tries.before + 1 >= spec.max_deliver:
        await _dead_letter(js, spec, msg, event, f"gave up: {again}")
        return
    metrics.MESSAGES.labels(spec.durable, "failed").inc()
    await _spend(js, msg, tries, again.delay)


async def _defer(js: JetStreamContext, msg: Msg, tries: Tries, delay: float, *, streak: int) -> None:
    """Hand the work back for later without spending a try: a copy that carries the count replaces it. The
    copy is published before the message is acked, so a crash in between leaves a duplicate (which every
    handler tolerates), never nothing."""
    headers = {k: v for k, v in (msg.headers or {}).items() if k not in _OWN_HEADERS}
    headers.update({
        TRIES_HEADER: str(tries.before), NOT_BEFORE_HEADER: f"{time.time() + max(delay, 0.0):.3f}",
        "Nats-Msg-Id": f"defer-{msg.metadata.stream}-{msg.metadata.sequence.stream}-{msg.metadata.num_delivered}",
    })
    if streak:
        headers[STREAK_HEADER] = str(streak)
    await js.publish(msg.subject, msg.data, headers=headers, timeout=5)
    await msg.ack()


async def _dead_letter(js: JetStreamContext, spec: ConsumerSpec[E], msg: Msg, event: Event | None, why: str) -> None:
    await _bury(js, spec, msg.data, msg.subject, msg.metadata.sequence.stream, event, why)
    await msg.term()


async def _bury(js: JetStreamContext, spec: ConsumerSpec[E], data: bytes, subject: str, seq: int,
                event: Event | None, why: str) -> None:
    """Keep the message for a person to inspect and fail its job. Both are idempotent: a dead letter is
    published once per stream sequence, and failing a job that already ended changes nothing."""
    metrics.MESSAGES.labels(spec.durable, "dead").inc()
    await js.publish(
        f"{DEAD_PREFIX}.{spec.durable}", data,
        headers={"Vidjobs-Dead-Reason": why[:500], "Vidjobs-Original-Subject": subject,
                 "Nats-Msg-Id": f"dead-{WORK_STREAM}-{seq}"},
    )
    if event is not None and spec.on_dead is not None:
        await spec.on_dead(event)


MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"


async def _on_max_deliveries(js: JetStreamContext, spec: ConsumerSpec[E], advisory: Msg) -> None:
    """JetStream stopped delivering a message (the backstop under `Tries`): bury it and take it out of the
    work queue, where it would otherwise sit forever."""
    try:
        seq = int(msgspec.json.decode(advisory.data)["stream_seq"])
        raw = await js.get_msg(WORK_STREAM, seq)
        try:
            event: Event | None = events.decode(raw.subject or spec.subject, raw.data or b"")
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError):
            event = None
        await _bury(js, spec, raw.data or b"", raw.subject or spec.subject, seq, event,
                    "JetStream's delivery limit was reached")
        await js.delete_msg(WORK_STREAM, seq)
        log.error("message reached JetStream's delivery limit; dead-lettered",
                  extra={"consumer": spec.durable, "job_id": getattr(event, "job_id", None), "seq": seq})
    except Exception as exc:  # another replica may have buried it already
        log.warning("could not handle a max-deliveries advisory", extra={"consumer": spec.durable,
                                                                          "error": repr(exc)})
