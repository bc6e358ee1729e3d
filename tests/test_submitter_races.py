"""A submit refused by the provider races a takeover of the same attempt by a second JobQueued delivery: the
refusal and the job's move to retrying commit together, so the takeover finds nothing left to submit and the
job is rendered once. The interleaving it once allowed:

A: claim (fresh) -> provider 503 -> record_refused commits -> ... (paused before fail_or_retry)
B: claim -> TAKEN_OVER (because error IS NOT NULL) -> find: none -> submit -> provider ACCEPTS (render 1)
A: fail_or_retry -> job pending -> retrying (error provider_unavailable)
B: record_accepted (attempt-1 row now says accepted), transition pending->submitted skipped
Backoff ends -> attempt 2 -> submitted again -> render 2. Render 1 is never used nor canceled.
"""

import asyncio
import contextlib
from datetime import UTC, datetime

import aiohttp
import pytest

from vidjobs.common import creation, events, jobs
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ProviderError, Redeliver
from vidjobs.common.events import JobQueued, RecoveryDue
from vidjobs.common.jobs import JobRequest
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import open_runtime
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret
from vidjobs.fakeprovider.serving import running_fake_provider
from vidjobs.providers.registry import adapter_for, build_adapters
from vidjobs.reaper import recovery
from vidjobs.storage.filesystem import FileStorage
from vidjobs.submitter import worker as submitter


async def test_refused_submit_and_takeover_race(database_url, nats_url, tmp_path, monkeypatch):
    secret = new_secret()
    async with running_fake_provider(webhook_secret=secret, callback_attempts=1) as provider:
        config = Settings().with_(
            data_dir=str(tmp_path), database_url=database_url, nats_url=nats_url,
            fake_provider="on", fake_provider_url=provider.url, fake_webhook_secret=secret, public_url="http://127.0.0.1:9",
            retry_base_s=0.05, retry_cap_s=0.2, provider_timeout_s=5,
        )
        async with open_runtime("repro", config) as rt, aiohttp.ClientSession() as session:
            adapters = build_adapters(config, session)
            ctx = submitter.Context(rt=rt, adapters=adapters, policies=Policies(config),
                                   storage=FileStorage(tmp_path / "objects", base_url=config.gateway_url, secret="s"))
            reaper = recovery.Context(rt=rt, policies=Policies(config))
            await rt.pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('a', 'a', 1000)")
            request = JobRequest(model="fake/default", prompt="fox", duration_s=1, seed=7,
                                 params={"scenario": "unavailable_then_succeed", "render_s": 0.1})
            async with rt.tx() as conn:
                job = await creation.create(conn, account_id="a", request=request, estimated_credits=10,
                                            recovery_delay_s=60)
            # The provider's first refusal was spent by an earlier call (e.g. one whose submitter was killed).
            adapter = adapter_for(adapters, "fake")
            with pytest.raises(ProviderError):
                await adapter.submit(await submitter.submit_request(ctx, job, adapter))

            a_refused, b_called, a_moved = asyncio.Event(), asyncio.Event(), asyncio.Event()
            real_refused, real_accepted = submitter._refused, submitter._accepted

            async def refused(*args, **kw):
                # Hold A between its refusal and the job's move for as long as B needs to call the provider
                # (B may instead wait on A's uncommitted refusal, which is the point).
                a_refused.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(b_called.wait(), 1.0)
                await real_refused(*args, **kw)
                a_moved.set()

            async def accepted(*args, **kw):
                b_called.set()
                await asyncio.wait_for(a_moved.wait(), 10)
                await real_accepted(*args, **kw)

            monkeypatch.setattr(submitter, "_refused", refused)
            monkeypatch.setattr(submitter, "_accepted", accepted)

            async def a():
                await submitter.handle(ctx, JobQueued(job_id=job.id), Delivery(1, events.SUBMIT))

            async def b():
                await a_refused.wait()
                # B defers (the attempt is still being answered) or finds nothing left to do; it never renders.
                with contextlib.suppress(Redeliver):
                    await submitter.handle(ctx, JobQueued(job_id=job.id), Delivery(2, events.SUBMIT))
                for delivery in range(3, 23):  # redelivered until A's refusal has committed
                    try:
                        await submitter.handle(ctx, JobQueued(job_id=job.id), Delivery(delivery, events.SUBMIT))
                        break
                    except Redeliver:
                        await asyncio.sleep(0.1)

            await asyncio.gather(a(), b())
            monkeypatch.setattr(submitter, "_refused", real_refused)
            monkeypatch.setattr(submitter, "_accepted", real_accepted)

            row = await jobs.fetch(rt.pool, job.id)
            subs = await rt.pool.fetch("SELECT attempt, provider_job_id, error FROM provider_submissions "
                                       "WHERE job_id = $1 ORDER BY attempt", job.id)
            print("\nafter the race:", row.status, "attempt", row.attempt, "provider_job_id", row.provider_job_id)
            print("submission rows:", [dict(s) for s in subs])
            print("provider renders:", {r.id: (r.request.metadata.attempt, r.status.value)
                                        for r in provider.renders.values()})

            # Backoff ends; the next attempt is submitted.
            await asyncio.sleep(0.5)
            row = await jobs.fetch(rt.pool, job.id)
            await recovery.on_recovery_due(reaper, RecoveryDue(job_id=job.id, due_at=row.recover_at),
                                           Delivery(1, events.RECOVERY))
            await submitter.handle(ctx, JobQueued(job_id=job.id), Delivery(1, events.SUBMIT))
            row = await jobs.fetch(rt.pool, job.id)
            await asyncio.sleep(0.3)
            print("finally:", row.status, "attempt", row.attempt, "provider_job_id", row.provider_job_id)
            print("provider renders:", {r.id: (r.request.metadata.attempt, r.status.value)
                                        for r in provider.renders.values()})
            print("renders_by_job:", provider.counters.renders_by_job.get(job.id), datetime.now(UTC))
            assert provider.counters.renders_by_job.get(job.id) == 1, "the job was rendered twice"
