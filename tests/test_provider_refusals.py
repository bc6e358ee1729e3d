"""A provider that refuses our account, not the job: out of credit (402) or our key refused (401). Its job fails at
once with what it is (`quota_exhausted`, `provider_misconfigured`), spending no attempt; the provider's breaker
opens, so its other jobs wait instead of being refused one by one, and one probe after the pause lets them through
once the key or the credit is put right; the operator is alerted. A status poll or a cancel met with a refused key
is not repeated at once, again and again, either."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import yaml
from prometheus_client import REGISTRY

from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import breakers, creation, events, jobs
from vidjobs.common.breakers import BreakerState
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode
from vidjobs.common.events import CancelRequested, PollRequested
from vidjobs.common.jobs import JobRequest
from vidjobs.common.outbox import Relay
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.fakeprovider.serving import running_fake_provider
from vidjobs.poller import worker as poller
from vidjobs.poller.signals import SignalContext
from vidjobs.providers.registry import build_adapters
from vidjobs.submitter import provider_gauges
from vidjobs.submitter.submissions import request_for

RULES = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "components" / "monitoring" / "monitoring.yaml"

# The fake provider's scenario -> the code its job fails with.
REFUSALS = {"no_credit": "quota_exhausted", "key_refused": "provider_misconfigured"}
# Long enough that the job created after a refusal meets the open breaker on any machine; the probe then goes
# after it.
COOLDOWN_S = 3


async def _breaker(database_url: str) -> dict | None:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow("SELECT * FROM provider_breakers WHERE provider = 'fake'")
        return dict(row) if row else None
    finally:
        await conn.close()


def _alerted_on(code: str) -> list[str]:
    """The alerts whose rule reads a provider's breaker held open by `code`, and its calls that ended in it."""
    rules = [rule for doc in yaml.safe_load_all(RULES.read_text()) if doc["kind"] == "PrometheusRule"
             for group in doc["spec"]["groups"] for rule in group["rules"] if "alert" in rule]
    return [rule["alert"] for rule in rules
            if f'vidjobs_provider_refusing{{code="{code}"}}' in rule["expr"]
            and f'vidjobs_provider_calls_total{{outcome="{code}"}}' in rule["expr"]]


async def test_a_provider_refusing_our_account_fails_the_job_at_once_and_pauses_until_a_probe_passes(
        tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, breaker_cooldown_s=COOLDOWN_S,
                              queue_sweep_interval_s=0.5, retry_base_s=0.2, retry_cap_s=0.5, max_attempts=3)
    seen = {}
    async with running_stack(settings) as stack:
        for scenario in REFUSALS:
            refused = await stack.create_job(params={"scenario": scenario})
            failed = await stack.wait_terminal(refused["id"], within=30)
            opened = await _breaker(database_url)
            # The key or the credit is put right: the provider takes the next job, once the pause lets it go.
            later = await stack.create_job(params={"render_s": 0.1})
            held = await wait_until(lambda job=later: _held_or_gone(stack, job["id"]), within=30,
                                    what="the next job to wait or go")
            done = await stack.wait_terminal(later["id"], within=60)
            seen[scenario] = (failed, opened, held, done, await stack.trail(refused["id"]),
                              await stack.trail(later["id"]), await _breaker(database_url))
        counters = await stack.counters()
        metrics = await stack.metrics("submitter")

    for scenario, code in REFUSALS.items():
        failed, opened, held, done, refused_trail, later_trail, closed = seen[scenario]
        # At once, with what it is, on its first attempt: one call to the provider, no retry.
        assert failed["status"] == "failed" and failed["attempt"] == 1, failed
        assert (failed["error"]["code"], failed["error"]["retryable"]) == (code, False)
        assert "our operators are alerted" in failed["error"]["message"], failed["error"]
        assert [(m["from"], m["to"]) for m in refused_trail][1:] == [("pending", "failed")]
        assert counters["submissions_by_job"][failed["id"]] == 1
        # The provider's breaker opened on that one answer, for this reason.
        assert opened is not None and (opened["state"], opened["cause"]) == ("open", code), opened
        # The next job waited, saying why, without calling the provider; then went as the probe, and rendered.
        assert held["status"] == "pending" and "refused" in (held["queue_reason"] or ""), held
        assert done["status"] == "completed" and done["attempt"] == 1
        assert "retrying" not in [m["to"] for m in later_trail]
        assert counters["submissions_by_job"][done["id"]] == 1
        assert closed is not None and (closed["state"], closed["failures"], closed["cause"]) == ("closed", 0, None)
        # What the operator's alert counts.
        assert _sample(metrics, code) == 1.0
        assert _alerted_on(code), f"no alert reads a provider refusing us with {code}"


async def _held_or_gone(stack, job_id: str) -> dict | None:
    """The job once it shows why it waits, or once it is no longer waiting (then it never said)."""
    job = await stack.job(job_id)
    return job if job["queue_reason"] or job["status"] != "pending" else None


def _sample(metrics: str, code: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("vidjobs_provider_calls_total{") and f'outcome="{code}"' in line \
                and 'operation="submit"' in line and 'provider="fake"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


# --- the breaker's bookkeeping ------------------------------------------------------------------------------


def _refusing(code: str) -> float | None:
    return REGISTRY.get_sample_value("vidjobs_provider_refusing", {"provider": "fake", "code": code})


async def test_one_refusal_opens_the_breaker_a_refused_probe_doubles_the_pause_and_an_accepted_one_closes_it(pool):
    settings = Settings(breaker_threshold=5, breaker_cooldown_s=30)
    rt = Runtime(name="submitter", settings=settings, pool=pool, nc=None, js=None,  # type: ignore[arg-type]
                 relay=Relay(pool, None))  # type: ignore[arg-type]
    async with pool.acquire() as conn:
        opened = await breakers.record_answer(conn, "fake", ErrorCode.PROVIDER_MISCONFIGURED, settings)
        await provider_gauges.refresh(rt, ["fake"])
        alerting = (_refusing("provider_misconfigured"), _refusing("quota_exhausted"))
        first = await breakers.read(conn, "fake")
        assert first is not None and first.reopen_at is not None
        waits = breakers.admission(first, "job_b", datetime.now(UTC))
        # The pause runs out; the next job to ask tests the provider, and is refused too.
        probe = breakers.admission(first, "job_c", first.reopen_at)
        await breakers.start_probe(conn, "fake", "job_c")
        reopened = await breakers.record_answer(conn, "fake", ErrorCode.QUOTA_EXHAUSTED, settings)
        second = await breakers.read(conn, "fake")
        # The operator puts it right: the next probe is accepted.
        await breakers.start_probe(conn, "fake", "job_d")
        closed = await breakers.record_answer(conn, "fake", None, settings)
        after = await breakers.read(conn, "fake")
        await provider_gauges.refresh(rt, ["fake"])

    assert opened is BreakerState.OPEN and (first.failures, first.cause) == (1, "provider_misconfigured")
    # What the operator's alert reads, from the first refusal until a probe passes.
    assert alerting == (1, 0) and (_refusing("provider_misconfigured"), _refusing("quota_exhausted")) == (0, 0)
    assert waits.wait_s is not None and "refused our credentials" in (waits.reason or "")
    assert probe.starts_probe
    assert reopened is BreakerState.OPEN and second is not None
    assert (second.cause, second.cooldown_s) == ("quota_exhausted", 60)
    assert "out of credit" in (breakers.admission(second, "job_e", datetime.now(UTC)).reason or "")
    assert closed is BreakerState.CLOSED and after is not None and (after.state, after.cause) == (BreakerState.CLOSED,
                                                                                                  None)


# --- status polls and cancels of a render whose provider refuses our key -------------------------------------


@pytest.fixture
async def poller_ctx(pool: asyncpg.Pool, tmp_path: Path) -> AsyncIterator[poller.Context]:
    """The poller's production context over the real database and the fake provider over HTTP."""
    secret = new_secret()
    async with running_fake_provider(webhook_secret=secret, callback_attempts=1) as provider:
        settings = Settings().with_(data_dir=str(tmp_path), fake_provider="on", fake_provider_url=provider.url,
                                    fake_webhook_secret=secret, provider_timeout_s=5)
        rt = Runtime(name="poller", settings=settings, pool=pool, nc=None, js=None,  # type: ignore[arg-type]
                     relay=Relay(pool, None))  # type: ignore[arg-type]
        async with aiohttp.ClientSession() as session:
            adapters = build_adapters(settings, session)
            yield poller.Context(rt=rt, adapters=adapters, signals=SignalContext(rt=rt, policies=Policies(settings)))


async def _submitted_with_revoked_key(ctx: poller.Context) -> jobs.JobRow:
    """A polled job whose render the provider accepted, after which it refuses our key on every call."""
    pool = ctx.rt.pool
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_k', 'k', 1000)")
    request = JobRequest(model="fake-poll/default", prompt="p", duration_s=1,
                         params={"scenario": "key_revoked", "render_s": 600})
    async with pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id="acct_k", request=request, estimated_credits=10,
                                    recovery_delay_s=60)
    accepted = await ctx.adapters["fake-poll"].submit(request_for(job))
    async with pool.acquire() as conn, conn.transaction():
        await transition(conn, job.id, JobStatus.SUBMITTED, reason="accepted",
                         update=JobUpdate(provider_job_id=accepted.provider_job_id))
        submitted = await jobs.fetch(conn, job.id)
    assert submitted is not None
    return submitted


def _calls(operation: str, outcome: str) -> float:
    labels = {"provider": "fake-poll", "operation": operation, "outcome": outcome}
    return REGISTRY.get_sample_value("vidjobs_provider_calls_total", labels) or 0.0


async def test_a_refused_key_on_a_poll_or_a_cancel_is_not_tried_again_at_once(poller_ctx):
    job = await _submitted_with_revoked_key(poller_ctx)
    assert job.provider_job_id is not None
    polls, cancels = _calls("status", "provider_misconfigured"), _calls("cancel", "provider_misconfigured")

    # A retryable error would be handed back to JetStream (Redeliver) every 2 s until the job ended; a refused
    # key is answered the same every time, so neither handler asks again: the poll schedule's taper and the
    # recovery checks do, and the operator is alerted.
    await poller.on_poll(poller_ctx, PollRequested(job_id=job.id, reason="recovery"), Delivery(1, events.POLL))
    await poller.on_cancel(poller_ctx, CancelRequested(job_id=job.id, provider="fake-poll",
                                                       provider_job_id=job.provider_job_id,
                                                       model_name=job.request.model_name),
                           Delivery(1, events.CANCEL))

    after = await jobs.fetch(poller_ctx.rt.pool, job.id)
    assert after is not None and after.status is JobStatus.SUBMITTED  # its render may still come, once the key works
    assert _calls("status", "provider_misconfigured") == polls + 1
    assert _calls("cancel", "provider_misconfigured") == cancels + 1
