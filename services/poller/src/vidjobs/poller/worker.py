"""The poller: turns every provider signal — a stored callback, a recovery poll, a scheduled poll — into
transitions through `signals.apply_signal`."""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import aiohttp
import asyncpg
import msgspec

from vidjobs.common import backoff, bus, events, faults, jobs, logs, metrics, render_timeouts, requestids, tracing
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ProviderError, Redeliver
from vidjobs.common.events import CancelRequested, InboxReceived, PollRequested
from vidjobs.common.jobs import JobRow
from vidjobs.common.render_deadlines import RenderDeadlines
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime, consumer, pause
from vidjobs.common.states import RENDERING
from vidjobs.poller import lost_rows, records, schedule
from vidjobs.poller.signals import LearnedBy, SignalContext, apply_signal
from vidjobs.providers.base import ProviderAdapter, ProviderSignal, ProviderState
from vidjobs.providers.http import call_timeout
from vidjobs.providers.registry import adapter_for, build_adapters

log = logging.getLogger("vidjobs.poller")

# A callback can beat the submitter's commit; give the submit answer this long to land.
_LOOKUP_S = 15.0


@dataclass(frozen=True)
class Context:
    rt: Runtime
    adapters: dict[str, ProviderAdapter]
    signals: SignalContext


async def main(rt: Runtime) -> None:
    timeout = call_timeout(rt.settings)
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=tracing.client_trace_configs()) as session:
        ctx = Context(rt=rt, adapters=build_adapters(rt.settings, session),
                      signals=SignalContext(rt=rt, policies=Policies(rt.settings),
                                            deadlines=RenderDeadlines(rt.settings)))
        async with asyncio.TaskGroup() as tg:
            for spec in consumers(ctx):
                tg.create_task(bus.consume(rt.js, spec, rt.stop), name=f"{spec.durable}-consumer")
            tg.create_task(run_schedule(ctx), name="poll-scheduler")
            tg.create_task(records.prune_every(rt), name="provider-answers-prune")


def consumers(ctx: Context) -> tuple[bus.ConsumerSpec[Any], ...]:
    """The poller's consumers, each handling as many messages at once as its setting says."""
    settings = ctx.rt.settings
    return (
        consumer(ctx.rt, "poller-inbox", events.INBOX, partial(on_inbox, ctx), concurrency=settings.inbox_concurrency),
        consumer(ctx.rt, "poller-poll", events.POLL, partial(on_poll, ctx), concurrency=settings.poll_concurrency),
        consumer(ctx.rt, "poller-cancel", events.CANCEL, partial(on_cancel, ctx),
                 concurrency=settings.cancel_concurrency),
    )


# The raw body is read only for a row stored without its signal.
_INBOX_ROW = """
SELECT provider, signal::text AS signal, CASE WHEN signal IS NULL THEN payload END AS payload,
       extract(epoch FROM now() - received_at) AS age_s
FROM webhook_inbox WHERE id = $1
"""


def stored_signal(ctx: Context, row: asyncpg.Record) -> ProviderSignal:
    """The signal the gateway parsed when it verified the callback, as it stored it. A row without one was
    stored before the inbox kept signals, or by a gateway of that release during a rollout: its raw body is
    parsed here, as it always was. Raises ProviderError when the raw body cannot be read."""
    if row["signal"] is not None:
        return msgspec.json.decode(row["signal"], type=ProviderSignal)
    return adapter_for(ctx.adapters, row["provider"]).parse_callback(bytes(row["payload"]))


async def on_inbox(ctx: Context, event: InboxReceived, delivery: Delivery) -> None:
    row = await ctx.rt.pool.fetchrow(_INBOX_ROW, event.inbox_id)
    if row is None:
        log.warning("inbox row missing", extra={"inbox_id": event.inbox_id})
        return
    try:
        sig = stored_signal(ctx, row)
    except ProviderError as err:
        log.error("stored callback cannot be read", extra={"inbox_id": event.inbox_id, "error": err.message})
        return
    job = await _job_for(ctx, row["provider"], sig)
    keep = ctx.rt.settings.provider_answers_per_job
    if job is None and await lost_rows.names_a_lost_job(ctx.rt.pool, sig):
        # No row will come: a job's row is committed before its render is asked for.
        metrics.UNMATCHED_CALLBACKS.labels(row["provider"]).inc()
        await lost_rows.stop_render(ctx.rt.pool, event.inbox_id, row["provider"], sig)
        return
    if job is None:
        if row["age_s"] < _LOOKUP_S:
            # The submitter may not have recorded the render id yet: look again a few times, further apart.
            raise Redeliver("no job for this provider id yet", delay=min(4.0, 0.25 * 2 ** delivery.attempt))
        metrics.UNMATCHED_CALLBACKS.labels(row["provider"]).inc()
        log.warning("callback for an unknown job", extra={"inbox_id": event.inbox_id,
                                                          "provider_job_id": sig.provider_job_id})
        await records.callback_handled(ctx.rt.pool, event.inbox_id, row["provider"], sig, None, keep=keep)
        return
    await records.callback_handled(ctx.rt.pool, event.inbox_id, row["provider"], sig, job, keep=keep)
    # From here the callback's work is the job's: it goes on under the request that created the job.
    logs.about_job(job.id, job.account_id)
    log.info("callback matched its job", extra={"job_id": job.id, "inbox_id": event.inbox_id,
                                                "callback_request_id": requestids.current()})
    requestids.continue_job(job.request_id)
    if not sig.verified:
        await poll_once(ctx, job.id, source="unsigned callback, confirmed by a status poll",
                        learned_by=LearnedBy.CALLBACK)
        return
    await apply_signal(ctx.signals, job, sig, source="callback", learned_by=LearnedBy.CALLBACK)


async def _job_for(ctx: Context, provider: str, sig: ProviderSignal) -> JobRow | None:
    if sig.job_id is not None:
        job = await jobs.fetch(ctx.rt.pool, sig.job_id)
        return job if job is not None and job.provider == provider else None
    job_id = await ctx.rt.pool.fetchval(
        "SELECT id FROM jobs WHERE provider = $1 AND provider_job_id = $2", provider, sig.provider_job_id,
    )
    return None if job_id is None else await jobs.fetch(ctx.rt.pool, job_id)


async def on_poll(ctx: Context, event: PollRequested, delivery: Delivery) -> None:
    if event.reason == "submitted":
        await schedule.add(ctx.rt.pool, event.job_id)
        return
    if event.reason == render_timeouts.DEADLINE_POLL:
        await poll_at_deadline(ctx, event.job_id)
        return
    learned_by = LearnedBy.RECOVERY_POLL if event.reason == "recovery" else LearnedBy.REQUESTED_POLL
    await poll_once(ctx, event.job_id, source=f"poll ({event.reason or 'requested'})", learned_by=learned_by)


async def poll_at_deadline(ctx: Context, job_id: str) -> None:
    """The render reached its deadline: its provider is asked once more and its answer acted on, so a render
    that finished after the last check is downloaded (a failed one fails with its own error); one the provider
    says is still going is timed out now. No answer: the reaper times it out once the question has had its time."""
    job = await jobs.fetch(ctx.rt.pool, job_id)
    if job is None or job.deadline_at is None or job.deadline_at > datetime.now(UTC):
        return  # gone, moved on, or on a later attempt with a deadline of its own
    answer = await poll_once(ctx, job_id, source="poll at the render's deadline", learned_by=LearnedBy.RECOVERY_POLL)
    if answer.alive:
        async with ctx.rt.tx() as conn:
            await render_timeouts.time_out(conn, job, ctx.signals.policies, why=f"{answer.value} when asked at it")


async def on_cancel(ctx: Context, event: CancelRequested, delivery: Delivery) -> None:
    """Ask the provider to stop a render we no longer want. Best effort: a provider that cannot cancel
    finishes the render, and its late signals find a finished job."""
    try:
        await adapter_for(ctx.adapters, event.provider).cancel(event.provider_job_id, model_name=event.model_name)
    except ProviderError as err:
        metrics.PROVIDER_CALLS.labels(event.provider, "cancel", err.code.value).inc()
        # A refusal of our account (a key refused, no credit) is not retried: every try would meet it.
        if err.retryable:
            # Counted: a provider that never lets us cancel ends in the dead letters, not in a loop.
            raise Redeliver(f"cancel failed: {err.message}", delay=err.retry_after or backoff.delay(
                delivery.attempt, base=1.0, cap=60.0), counts=True) from err
        log.warning("provider refused to cancel", extra={"job_id": event.job_id, "code": err.code.value})
        return
    metrics.PROVIDER_CALLS.labels(event.provider, "cancel", "ok").inc()
    log.info("asked the provider to stop", extra={"job_id": event.job_id, "provider_job_id": event.provider_job_id})


class Answer(enum.Enum):
    """What one poll learned of a render."""

    NOT_RENDERING = "not rendering"  # the job is gone, finished, or has no render to ask about
    RENDERING = "still rendering"  # the provider says it is queued or running
    ENDED = "ended"  # the provider says it succeeded, failed or was canceled (and the job moved on it)
    REFUSED = "refused"  # the provider refused the question for good (a retryable failure raises Redeliver)

    @property
    def alive(self) -> bool:
        """Whether the render's poll schedule goes on."""
        return self in (Answer.RENDERING, Answer.REFUSED)


async def poll_once(ctx: Context, job_id: str, *, source: str, learned_by: LearnedBy) -> Answer:
    """Ask the provider about a rendering job and apply what it says."""
    job = await jobs.fetch(ctx.rt.pool, job_id)
    if job is None or job.finished or job.status not in RENDERING or job.provider_job_id is None:
        return Answer.NOT_RENDERING
    logs.about_job(job.id, job.account_id)
    adapter = adapter_for(ctx.adapters, job.provider)
    try:
        sig = await adapter.status(job.provider_job_id, model_name=job.request.model_name)
    except ProviderError as err:
        metrics.PROVIDER_CALLS.labels(job.provider, "status", err.code.value).inc()
        if err.retryable:
            raise Redeliver(f"status poll failed: {err.message}", delay=err.retry_after or 2.0) from err
        # Not asked again at once (a refused key is refused every time): the render may still be there once an
        # operator fixes it, so the schedule's taper and the recovery checks ask at their pace until its deadline.
        log.error("status poll refused", extra={"job_id": job.id, "code": err.code.value, "error": err.message})
        await records.poll_refused(ctx.rt.pool, job, err, keep=ctx.rt.settings.provider_answers_per_job)
        return Answer.REFUSED
    metrics.PROVIDER_CALLS.labels(job.provider, "status", "ok").inc()
    await records.poll_answered(ctx.rt.pool, job, sig, keep=ctx.rt.settings.provider_answers_per_job)
    await apply_signal(ctx.signals, job, sig, source=source, learned_by=learned_by)
    return Answer.RENDERING if sig.state in (ProviderState.QUEUED, ProviderState.RUNNING) else Answer.ENDED


async def run_schedule(ctx: Context, *, tick_s: float = 1.0, batch: int = 64) -> None:
    while not ctx.rt.stop.is_set():
        try:
            due = await schedule.take_due(ctx.rt.pool, batch)
        except Exception as exc:
            if not faults.is_infrastructure(exc):
                raise
            # The database is restarting or failing over: the schedule is in it, so wait and read it again.
            log.warning("poll schedule unreadable; trying again", extra={"error": repr(exc)})
            await pause(ctx.rt, tick_s * 2)
            continue
        for failed in await asyncio.gather(*(_scheduled_poll(ctx, job_id) for job_id in due), return_exceptions=True):
            if failed is not None:  # the row stays and is polled again at its next time
                log.warning("scheduled poll could not finish", extra={"error": repr(failed)})
        if len(due) == batch:
            continue  # more may be due already
        await pause(ctx.rt, tick_s)


async def _scheduled_poll(ctx: Context, job_id: str) -> None:
    try:
        answer = await poll_once(ctx, job_id, source="scheduled poll", learned_by=LearnedBy.SCHEDULED_POLL)
    except Redeliver as again:
        log.info("scheduled poll will try again", extra={"job_id": job_id, "why": str(again)})
        return
    except Exception:
        # One bad poll must not stop the scheduler; the row stays and is polled at its next time.
        log.exception("scheduled poll failed", extra={"job_id": job_id})
        return
    if not answer.alive:
        await schedule.remove(ctx.rt.pool, job_id)
