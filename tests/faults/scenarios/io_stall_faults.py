"""Servers that stop answering without dying: the S3 server (moto) and the render provider (the fake provider),
each stopped with SIGSTOP for a while and continued. The kernel still accepts connections to a stopped process
(its listen backlog) and keeps what is sent to it, so every client meets the half-open case: a request goes
out, and no answer comes until the process runs again (a stalled disk, a long VM pause, a proxy that holds).

While the server is stopped, the API is asked again and again (each request timed), and so is the media
worker's /readyz. What must hold, beside every scenario's promises: no API answer waits much past the time
limit on the stalled part, no 5xx but 503, and no job fails or is stuck for the stall (downloads and copies
wait it out, submits and polls are tried again), and no job is rendered more than once per attempt."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from tests.faults import api_probe
from tests.faults.api_probe import Call, Probes
from tests.faults.harness import FaultRun, fault_run
from tests.faults.objectstore import RestartableMoto, running_moto
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick
from tests.faults.workload import Created, create_jobs
from tests.imagefiles import png_with_text

BUCKET = "vidjobs-faults"
# Renders end a few seconds in, so the stall catches jobs at every stage: submitting, rendering, copying.
S3_STALL = (Plan(jobs=16, over_s=10, at_s=3, lasts_s=20, settle_s=90, render_s=1.5),
            Plan.long(jobs=100, over_s=80, at_s=5, lasts_s=120, settle_s=400, render_s=2))
PROVIDER_STALL = (Plan(jobs=16, over_s=10, at_s=3, lasts_s=20, settle_s=90, render_s=1.5),
                  Plan.long(jobs=100, over_s=80, at_s=5, lasts_s=120, settle_s=400, render_s=2))
# The longest a client may wait for an answer while a part is stalled: the default bound on one call to the
# object store (VIDJOBS_STORAGE_TIMEOUT_S times VIDJOBS_STORAGE_ATTEMPTS: 6 s), with a generous margin for a
# loaded machine.
ANSWER_WITHIN_S = 15.0
# A copy handling longer than this held its download slot through the stall rather than giving it back.
HELD_SLOT_S = 10.0


def stopped(pid: int) -> Callable[[], Awaitable[None]]:
    async def stop() -> None:
        os.kill(pid, signal.SIGSTOP)
    return stop


def continued(pid: int) -> Callable[[], Awaitable[None]]:
    async def resume() -> None:
        os.kill(pid, signal.SIGCONT)
    return resume


async def a_finished_job(run: FaultRun) -> str:
    """A job completed before the stall, read during it (its links are signed for each read)."""
    job = await run.stack.create_job(params={"render_s": 0.2})
    await run.stack.wait_terminal(job["id"], within=60)
    return str(job["id"])


async def under_stall(run: FaultRun, plan: Plan, pid: int, calls: dict[str, Call]) -> Probes:
    """The plan's workload; `plan.at_s` into it the process `pid` is stopped, and continued `plan.lasts_s`
    later. `calls` are made every second while it is stopped, and the media worker's /readyz with them."""
    probes, done = Probes(), asyncio.Event()
    creating = asyncio.create_task(create_jobs(run.stack, plan.workload()))
    probing: asyncio.Task[None] | None = None
    try:
        await asyncio.sleep(plan.at_s)
        run.say("stall begins")
        await stopped(pid)()
        probing = asyncio.create_task(api_probe.probing(calls, done, probes,
                                                        ready_port=run.stack.metrics_port("media")))
        await asyncio.sleep(plan.lasts_s)
    finally:
        await continued(pid)()  # whatever happened: a stopped process would outlive the run
        done.set()
    run.fault_end = datetime.now(UTC)
    run.say("stall ends")
    if probing is not None:
        await probing
    created: Created = await creating
    run.say(f"{len(created.ids)} jobs created ({created.retries} create retries, {len(created.refused)} refused)")
    await run.settle(created, plan.settle_s, plan.stall_s)
    return probes


def held_slots(metrics: str) -> tuple[int, int]:
    """(media-download handlings that took over HELD_SLOT_S, all of them), from media's /metrics."""
    def value(name: str, labels: str) -> int:
        line = next(line for line in metrics.splitlines() if line.startswith(f"{name}{{{labels}}}"))
        return int(float(line.rsplit(" ", 1)[1]))

    consumer = 'consumer="media-download"'
    total = value("vidjobs_message_handle_seconds_count", consumer)
    return total - value("vidjobs_message_handle_seconds_bucket", f'{consumer},le="{HELD_SLOT_S:.1f}"'), total


async def s3_stall(long: bool = False) -> Row:
    plan = pick(*S3_STALL, long)
    async with running_moto(BUCKET) as moto:
        return await _s3_run(moto, plan)


async def _s3_run(moto: RestartableMoto, plan: Plan) -> Row:
    async with fault_run("s3_stall", storage_url=f"s3://{BUCKET}/faults") as run:
        try:
            assert moto.server is not None
            job_id = await a_finished_job(run)
            calls = {"GET /v1/jobs/{id}": api_probe.get_job(run.stack, job_id),
                     "POST /v1/uploads": api_probe.upload(run.stack, png_with_text())}
            probes = await under_stall(run, plan, moto.server.proc.pid, calls)
            held, copies = held_slots(await run.stack.metrics("media"))
        finally:
            shutil.copy(moto.home / "moto.log", run.log_dir / "moto.log")
        run.expect_healthy_outcome()
        run.expect_no_service_restarts()
        probes.report(run.row, within_s=ANSWER_WITHIN_S)
        run.row.expect(probes.ready["not ready"] > 0, "media's /readyz never said storage was not answering")
        run.row.notes.append(f"copy handlings over {HELD_SLOT_S:.0f} s (a slot held through the stall): {held} "
                             f"of {copies}")
    return run.row


async def provider_stall(long: bool = False) -> Row:
    plan = pick(*PROVIDER_STALL, long)
    async with fault_run("provider_stall") as run:
        job_id = await a_finished_job(run)
        pid = run.supervisor.pid("fake-provider")
        assert pid is not None
        calls = {"GET /v1/jobs/{id}": api_probe.get_job(run.stack, job_id)}
        probes = await under_stall(run, plan, pid, calls)
        # A provider that stalls is waited out: every job completes.
        run.expect_healthy_outcome()
        # Submits sent into the stopped provider wait in its socket and are rendered once it runs again: the
        # attempt they were for is kept meanwhile (asked again under the same key), never given up for a new
        # one, so each attempt is rendered once.
        row = run.row
        row.expect(row.max_renders_per_attempt <= 1,
                   f"at most {row.max_renders_per_attempt:.2f} renders an attempt (more than one)")
        run.expect_no_service_restarts()
        probes.report(run.row, within_s=ANSWER_WITHIN_S)
    return run.row
