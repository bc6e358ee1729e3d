"""Event streams at launch-day scale (vidjobs.gateway.feeds), through the real stack:

- a job of an account with 40 waiting jobs, each followed by a stream, starting costs the gateway a bounded
  number of statements whatever the number of streams (counted in PostgreSQL's own statement log);
- a stream whose job cannot be read for longer than an API request's deadline (the database stalled) stays
  open and sees the job's final state;
- API reads answer while 1,000 streams follow jobs that move through every stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg
import nats

from bench.statements import start_logging, stop_logging
from tests.faults.postgres import LocalPostgres
from tests.faults.stall import Stall
from tests.stack import Stack, demo_key, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import db, events
from vidjobs.common.events import JobChanged

TERMINAL = {"completed", "failed", "canceled", "expired"}


@dataclass
class Watched:
    """One open stream, as a client reads it: every job event, and how it ended."""

    job_id: str
    seen: list[dict] = field(default_factory=list)
    status: int | None = None
    ended: bool = False

    @property
    def last(self) -> dict | None:
        return self.seen[-1] if self.seen else None

    @property
    def finished(self) -> bool:
        return self.last is not None and self.last["status"] in TERMINAL


async def watch(session: aiohttp.ClientSession, url: str, headers: dict, watched: Watched) -> None:
    """Read the job's stream to its end, without reconnecting (so an early end shows)."""
    async with session.get(f"{url}/v1/jobs/{watched.job_id}/stream", headers=headers,
                           timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as resp:
        watched.status = resp.status
        if resp.status != 200:
            watched.ended = True
            return
        data: list[str] = []
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                data.append(line[6:])
            elif not line and data:
                watched.seen.append(json.loads("\n".join(data)))
                data = []
    watched.ended = True


@contextlib.asynccontextmanager
async def streams(url: str, key: str, job_ids: list[str]) -> AsyncIterator[list[Watched]]:
    watched = [Watched(job_id) for job_id in job_ids]
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(watch(session, url, headers, w)) for w in watched]
        try:
            async def opened() -> bool:
                return all(w.seen or w.status not in (None, 200) for w in watched)

            await wait_until(opened, within=60, what="every stream's first event")
            yield watched
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def own_database(server: LocalPostgres) -> str:
    conn = await asyncpg.connect(server.admin_url)
    try:
        await conn.execute('CREATE DATABASE "vidjobs"')
    finally:
        await conn.close()
    await db.migrate(server.url("vidjobs"))
    return server.url("vidjobs")


def job_reads(log: Path, offset: int) -> list[str]:
    """The reads of a job as a client sees it (the job with its queue place: a GET, a page, a stream's read)
    that gateway sessions ran, as PostgreSQL logged them after `offset`. A logged statement spans lines; each
    entry starts with the log's time stamp."""
    text = log.read_text(errors="replace")[offset:]
    entries = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", text)
    return [e for e in entries if "<vidjobs-gateway" in e and "LOG:" in e and "AS waiting_position" in e]


@contextlib.asynccontextmanager
async def deep_queue(tmp_path: Path, server: LocalPostgres, nats_url: str,
                     depth: int = 40) -> AsyncIterator[tuple[Stack, str, dict, list[str]]]:
    """A stack on a database of its own, whose account (one render at a time) has one render in flight that
    never ends and `depth` jobs waiting behind it: the stack, its database URL, the render, the waiting ids."""
    database_url = await own_database(server)
    settings = stack_settings(tmp_path, database_url, nats_url)
    async with running_stack(settings, key=await demo_key(database_url, concurrency=1)) as stack:
        first = await stack.create_job(params={"scenario": "hang"})
        await stack.wait_for_status(first["id"], "submitted", "processing")
        waiting = [(await stack.create_job(params={"scenario": "hang"}))["id"] for _ in range(depth)]
        yield stack, database_url, first, waiting


async def test_a_job_starting_costs_a_bounded_number_of_reads_whatever_the_number_of_streams(
        tmp_path, own_postgres, nats_url):
    async with deep_queue(tmp_path, own_postgres, nats_url) as (stack, database_url, first, waiting):
        async with streams(stack.url, stack.key, waiting) as watched:
            assert [w.last["queue_position"] for w in watched] == list(range(1, 41))

            # The submitter records why each waits once it has taken the job's message: each such change is read
            # (the job's reason is news), so the count starts once all are recorded. On a slow machine the
            # submitter can still be at it when the streams have shown their first events.
            async def reasons_shown() -> bool:
                return all(w.last["queue_reason"] for w in watched)

            await wait_until(reasons_shown, within=30, what="every stream to show why its job waits")
            await start_logging(database_url)
            log = own_postgres.home / "postgres.log"
            offset = len(log.read_text(errors="replace"))
            # The first waiting job starts; every other moves up one.
            async with stack.session.post(f"{stack.url}/v1/jobs/{first['id']}/cancel", headers=stack.auth) as resp:
                assert resp.status == 200, await resp.text()

            async def caught_up() -> bool:
                started = watched[0].last["status"] in ("submitted", "processing")
                moved = [w.last["queue_position"] for w in watched[1:]] == list(range(1, 40))
                return started and moved

            await wait_until(caught_up, within=30, what="every stream to show the queue moved")
            await asyncio.sleep(1.0)  # what is still on its way is counted too
            await stop_logging(database_url)
            reads = job_reads(log, offset)

    # The cancel's answer, the started job's read and one of the queue, what tells the apps: a handful, where
    # each of the 40 streams used to read its job again (at least 40 reads).
    assert len(reads) <= 10, f"{len(reads)} reads:\n" + "\n".join(r[:300] for r in reads)


def jobs_read_by_id(log: Path, offset: int) -> int:
    """How many jobs the gateway's reads by id (a stream's feed, read alone or with its account's) asked for,
    from the parameters PostgreSQL logged with each."""
    text = log.read_text(errors="replace")[offset:]
    # The parameters follow their statement as an entry of their own; only these reads take an array of ids.
    arrays = re.findall(r"<vidjobs-gateway[^>]*> .*DETAIL:  parameters: .*\$2 = '\{(job_[^}]*)\}'", text)
    return sum(len(ids.split(",")) for ids in arrays)


async def test_streams_opening_one_by_one_on_a_deep_queue_read_each_job_once(tmp_path, own_postgres, nats_url):
    """A page opening a stream on each of an account's 40 waiting jobs, one after another (each once the one
    before has shown its job): each opening reads its own job, not again every waiting job already followed
    (which made a queue k deep cost k²/2 job reads to open, and held each opening behind the last)."""
    async with deep_queue(tmp_path, own_postgres, nats_url) as (stack, database_url, _, waiting):
        await start_logging(database_url)
        log = own_postgres.home / "postgres.log"
        offset = len(log.read_text(errors="replace"))
        async with contextlib.AsyncExitStack() as opened:
            for job_id in waiting:
                watched = await opened.enter_async_context(streams(stack.url, stack.key, [job_id]))
                assert watched[0].last is not None and watched[0].last["status"] == "pending"
            await asyncio.sleep(1.0)  # what is still on its way is counted too
            await stop_logging(database_url)
        asked = jobs_read_by_id(log, offset)

    assert len(waiting) <= asked <= 2 * len(waiting), f"{asked} jobs read to open {len(waiting)} streams"


async def test_a_stream_whose_job_cannot_be_read_for_a_while_stays_open_and_sees_the_end(
        tmp_path, own_postgres, nats_url):
    # An API request gives the database 1 s; the stall lasts 3 s.
    database_url = await own_database(own_postgres)
    settings = stack_settings(tmp_path, database_url, nats_url, db_call_timeout_s=1)
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"render_s": 4})
        async with streams(stack.url, stack.key, [job["id"]]) as (watched,):
            async def at_provider() -> bool:
                return watched.last["status"] in ("submitted", "processing")

            await wait_until(at_provider, within=30, what="the job at its provider")
            nc = await nats.connect(nats_url)
            try:
                with Stall(lambda: own_postgres.pid).guarded() as stall:
                    stall.begin()
                    # A change hint while nothing can be read: the stream's job must be read again.
                    hint = JobChanged(job_id=job["id"], status="processing", at=watched.last["updated_at"])
                    await nc.publish(events.subject_for(hint), events.encode(hint))
                    await nc.flush()
                    await asyncio.sleep(3)
                    stall.end()
            finally:
                await nc.close()
            async def over() -> bool:
                return watched.finished or watched.ended

            await wait_until(over, within=60, what="the stream to end")

    assert watched.finished, f"the stream ended early, at {watched.last['status']}"
    assert watched.last["status"] == "completed"


async def test_api_reads_answer_while_a_thousand_streams_follow_moving_jobs(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=5, recovery_interval_s=5,
                              max_streams_per_account=1000, max_streams_per_key=1000)
    async with running_stack(settings) as stack:
        other = await stack.create_job(params={"render_s": 0.1})
        answers: list[int] = []
        done = asyncio.Event()

        async def read_other() -> None:
            while not done.is_set():
                async with stack.session.get(f"{stack.url}/v1/jobs/{other['id']}", headers=stack.auth) as resp:
                    answers.append(resp.status)
                await asyncio.sleep(0.05)

        reading = asyncio.create_task(read_other())
        jobs = [(await stack.create_job(params={"render_s": 3}))["id"] for _ in range(50)]
        async with streams(stack.url, stack.key, [j for j in jobs for _ in range(20)]) as watched:
            async def over() -> bool:
                return all(w.finished or w.ended for w in watched)

            await wait_until(over, within=120, what="every stream to end")
            done.set()
            await reading

    statuses = [w.status for w in watched]
    assert len(watched) == 1000 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    left = [(w.job_id, w.last and w.last["status"], w.ended) for w in watched if not w.finished]
    assert not left, f"{len(left)} streams did not see their job's end, e.g. {left[:5]}"
    assert len(answers) > 10 and set(answers) == {200}, answers
