"""What happened to a run's jobs, read from where the truth is: the jobs and job_transitions tables and the
fake provider's counters."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime

import aiohttp
import asyncpg

from tests.faults.report import Row
from vidjobs.common.states import TERMINAL

TERMINAL_NAMES = [s.value for s in TERMINAL]


async def status_counts(conn: asyncpg.Connection, ids: list[str]) -> Counter:
    rows = await conn.fetch("SELECT status::text AS s, count(*) AS n FROM jobs WHERE id = ANY($1) GROUP BY 1", ids)
    return Counter({r["s"]: r["n"] for r in rows})


async def _poll(database_url: str, ids: list[str]) -> tuple[Counter, int] | None:
    """(status counts, newest transition id) of the jobs, or None while the database is unreachable."""
    try:
        conn = await asyncpg.connect(database_url, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    try:
        newest = await conn.fetchval("SELECT coalesce(max(id), 0) FROM job_transitions WHERE job_id = ANY($1)", ids)
        return await status_counts(conn, ids), newest
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    finally:
        await conn.close()


async def wait_settled(database_url: str, ids: list[str], within_s: float, *, stall_s: float,
                       say=print) -> Counter:
    """Status counts once every job is terminal, or `within_s` has passed, or no job has moved for
    `stall_s` (longer than several recovery intervals and an ack wait: the safety nets had their chance)."""
    loop = asyncio.get_running_loop()
    deadline, moved_at, said_at, newest = loop.time() + within_s, loop.time(), 0.0, -1
    counts: Counter = Counter()
    while loop.time() < deadline and loop.time() - moved_at < stall_s:
        polled = await _poll(database_url, ids)
        if polled is not None:
            counts, latest = polled
            if sum(counts[s] for s in TERMINAL_NAMES) >= len(ids):
                return counts
            if latest != newest:
                newest, moved_at = latest, loop.time()
            if loop.time() - said_at > 10:
                say(f"waiting for jobs to settle: {dict(counts)}")
                said_at = loop.time()
        await asyncio.sleep(0.5)
    return counts


async def provider_counters(fake_provider_url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(f"{fake_provider_url}/v1/_counters") as resp:
        return await resp.json()


def repeated_moves(trail: list[asyncpg.Record]) -> int:
    """Moves made twice within one attempt. An attempt ends where the job goes retrying -> pending, so the
    moves of the next attempt may legitimately repeat those of the last."""
    repeats, seen = 0, set()
    for move in trail:
        key = (move["from_status"], move["to_status"])
        if key == ("retrying", "pending"):
            seen = set()
        repeats += key in seen
        seen.add(key)
    return repeats


async def renders_per_attempt(conn: asyncpg.Connection, ids: list[str], counters: dict) -> tuple[float, int]:
    """(max over jobs of renders / attempts submitted, jobs rendered more often than submitted). An attempt
    counts as submitted once its provider_submissions row names the provider's job; a job with a render but
    no such row yet (the answer was lost) counts one attempt."""
    submitted = {r["job_id"]: r["n"] for r in await conn.fetch(
        "SELECT job_id, count(*) AS n FROM provider_submissions WHERE job_id = ANY($1) "
        "AND provider_job_id IS NOT NULL GROUP BY job_id", ids)}
    renders = counters.get("renders_by_job", {})
    ratios = [renders.get(i, 0) / max(submitted.get(i, 0), 1) for i in ids]
    return max(ratios, default=0.0), sum(r > 1 for r in ratios)


async def fill_row(row: Row, database_url: str, fake_provider_url: str, ids: list[str],
                   fault_end: datetime | None) -> None:
    """Everything in the row that the database and the provider know."""
    counters = await provider_counters(fake_provider_url)
    conn = await asyncpg.connect(database_url)
    try:
        counts = await status_counts(conn, ids)
        trails: dict[str, list[asyncpg.Record]] = {}
        for t in await conn.fetch("SELECT job_id, from_status::text AS from_status, to_status::text AS to_status, "
                                  "at FROM job_transitions WHERE job_id = ANY($1) ORDER BY id", ids):
            trails.setdefault(t["job_id"], []).append(t)
        row.max_renders_per_attempt, row.over_rendered = await renders_per_attempt(conn, ids, counters)
        unpublished = await conn.fetchval("SELECT count(*) FROM outbox")
    finally:
        await conn.close()
    if unpublished:
        # Events committed but never published: a sign that some process's outbox relay has stopped.
        row.notes.append(f"{unpublished} outbox rows still unpublished at the end")
    row.created = len(ids)
    row.completed, row.failed = counts["completed"], counts["failed"]
    row.stuck = len(ids) - sum(counts[s] for s in TERMINAL_NAMES)
    if row.stuck:
        row.notes.append(f"not terminal: {dict((s, n) for s, n in counts.items() if s not in TERMINAL_NAMES)}")
    row.repeated_moves = sum(repeated_moves(t) for t in trails.values())
    if fault_end is not None:
        row.recover_s, row.drain_s = recovery_times(trails, fault_end)


def recovery_times(trails: dict[str, list[asyncpg.Record]], fault_end: datetime) -> tuple[float | None, float | None]:
    """(fault end -> first completion after it, fault end -> the last terminal move of any job)."""
    completions = [t["at"] for trail in trails.values() for t in trail
                   if t["to_status"] == "completed" and t["at"] >= fault_end]
    endings = [t["at"] for trail in trails.values() for t in trail
               if t["to_status"] in TERMINAL_NAMES and t["at"] >= fault_end]
    first = (min(completions) - fault_end).total_seconds() if completions else None
    last = (max(endings) - fault_end).total_seconds() if endings else None
    return first, last
