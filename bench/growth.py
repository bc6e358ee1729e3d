"""What the hot reads and scans cost as the tables grow: 10 k, 100 k and 1 M jobs in PostgreSQL, almost all
of them finished, the live ones the same few at every size.

    python bench/growth.py [--sizes 10000,100000,1000000] [--runs 200]

Each operation is run as the service runs it, on one connection, `--runs` times after a warm-up, and p50 /
p99 are printed in milliseconds with the ratio of each size's p50 to the smallest size's. Writes are rolled
back, so every run sees the same tables. Each operation's statements are captured as they are sent and
EXPLAINed, and the scans of `jobs`, `provider_submissions` and `assets` in their plans are named: an index scan keeps
its cost flat as finished jobs pile up, a sequential scan does not.

Uses VIDJOBS_DATABASE_URL when set (a scratch database is created and dropped there), else an embedded
PostgreSQL from the pgserver wheel. Filling a million jobs takes a minute or two.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dispatch import drop_database, scratch_database  # noqa: E402
from vidjobs.common import db, estimates, jobs  # noqa: E402
from vidjobs.common.settings import ProviderLimits, Settings  # noqa: E402
from vidjobs.common.waiting import queue_count  # noqa: E402
from vidjobs.gateway import tenant  # noqa: E402
from vidjobs.poller import schedule  # noqa: E402
from vidjobs.reaper import retention, sweep  # noqa: E402
from vidjobs.submitter import slots  # noqa: E402

HEAVY = "acct_heavy"  # holds a tenth of all jobs: the account whose listing and queue are measured
ACCOUNTS = 200
REQUEST = {"model": "fake/default", "prompt": "growth", "duration_s": 1}
LIVE = {"pending": 60, "submitted": 10, "processing": 20, "downloading": 10}  # the same at every size
CLAIM_TTL_S = 45.0

Operation = Callable[[asyncpg.Connection], Awaitable[Any]]


async def grow(conn: asyncpg.Connection, have: int, want: int) -> None:
    """Add finished jobs (with their answered submissions and their renders' asset rows) until there are
    `want` in all. A tenth are the heavy account's; their ages spread over 90 days, so some completed ones are
    past retention."""
    step = 100_000
    for start in range(have, want, step):
        end = min(want, start + step)
        await conn.execute(
            """
            INSERT INTO jobs (id, account_id, model, provider, request, status, provider_job_id, estimated_credits,
                              actual_credits, created_at, updated_at, submitted_at, rendered_at, completed_at)
            SELECT 'job_g' || lpad(i::text, 9, '0'),
                   CASE WHEN i % 10 = 0 THEN $3 ELSE 'acct_' || (i % $4) END,
                   'fake/default', 'fake', $5::jsonb,
                   (ARRAY['completed', 'completed', 'completed', 'failed', 'canceled', 'expired']
                   )[1 + i % 6]::job_status,
                   'render_g' || i, 10, 10, t, t + interval '40 seconds', t + interval '1 second',
                   t + interval '30 seconds', t + interval '40 seconds'
            FROM generate_series($1 + 1, $2) i,
                 LATERAL (SELECT now() - make_interval(secs => (i::bigint * 7919) % 7776000) AS t) a
            """,
            start, end, HEAVY, ACCOUNTS, REQUEST,
        )
        await conn.execute(
            """
            INSERT INTO provider_submissions (job_id, attempt, provider, idempotency_key, provider_job_id,
                                              claimed_at, answered_at)
            SELECT 'job_g' || lpad(i::text, 9, '0'), 1, 'fake', 'job_g' || i || '-a1', 'render_g' || i,
                   now() - interval '1 day', now() - interval '1 day'
            FROM generate_series($1 + 1, $2) i
            """,
            start, end,
        )
        # A finished render's files, as the media service records them: every read of the job builds its
        # outputs from these rows.
        await conn.execute(
            """
            INSERT INTO assets (job_id, account_id, kind, key, content_type, bytes, sha256, width, height)
            SELECT j.id, j.account_id, k.kind, j.id || '/' || k.kind, 'video/mp4', 1000, 'x', 1280, 720
            FROM jobs j CROSS JOIN (VALUES ('video'), ('thumbnail'), ('preview')) AS k (kind)
            WHERE j.id BETWEEN 'job_g' || lpad(($1::int + 1)::text, 9, '0') AND 'job_g' || lpad($2::int::text, 9, '0')
              AND j.status IN ('completed', 'expired')
            """,
            start, end,
        )
        print(f"  {end:,} finished jobs", file=sys.stderr, flush=True)
    # Also clears what the rolled-back runs at the smaller size left dead in the small, busy tables.
    await conn.execute("VACUUM ANALYZE")


async def live_jobs(conn: asyncpg.Connection) -> None:
    """The jobs still going, the same at every size: some waiting (a third of them the heavy account's),
    some at the provider (on the poll schedule), some downloading, each with a recovery time."""
    n = 0
    for status, count in LIVE.items():
        await conn.execute(
            """
            INSERT INTO jobs (id, account_id, model, provider, request, status, provider_job_id,
                              estimated_credits, recover_at, created_at, updated_at)
            SELECT 'job_l' || lpad(($1 + i)::text, 6, '0'), CASE WHEN i % 3 = 0 THEN $4 ELSE 'acct_' || i END,
                   'fake/default', 'fake', $5::jsonb, $3::job_status,
                   CASE WHEN $3 = 'pending' THEN NULL ELSE 'render_l' || ($1 + i) END, 10,
                   now() + interval '30 seconds', now() - make_interval(secs => 60 - i), now()
            FROM generate_series(1, $2) i
            """,
            n, count, status, HEAVY, REQUEST,
        )
        n += count


async def setup(conn: asyncpg.Connection) -> None:
    await conn.execute("INSERT INTO accounts (id, name, concurrent_jobs) VALUES ($1, 'heavy', 100)", HEAVY)
    await conn.execute("INSERT INTO accounts (id, name, concurrent_jobs) SELECT 'acct_' || i, 'account ' || i, 100 "
                       "FROM generate_series(0, $1) i", ACCOUNTS)
    await live_jobs(conn)


async def fresh_small_tables(conn: asyncpg.Connection) -> None:
    """The rolled-back runs leave the small, busy tables bloated (an index entry per update of a due time),
    and their statistics then steer the planner elsewhere: each size starts them over exactly alike, so the
    sizes differ only in jobs."""
    await conn.execute("TRUNCATE poll_schedule")
    await conn.execute("INSERT INTO poll_schedule (job_id, next_poll_at) SELECT id, now() + interval '1 second' "
                       "FROM jobs WHERE status IN ('submitted', 'processing')")
    await conn.execute("VACUUM FULL ANALYZE poll_schedule, provider_rate_buckets, account_turns")


def rolled_back(op: Operation) -> Operation:
    async def run(conn: asyncpg.Connection) -> Any:
        tx = conn.transaction()
        await tx.start()
        try:
            return await op(conn)
        finally:
            await tx.rollback()
    return run


async def operations(conn: asyncpg.Connection) -> dict[str, Operation]:
    finished = await conn.fetchval("SELECT id FROM jobs WHERE account_id = $1 AND status = 'completed' "
                                   "ORDER BY created_at LIMIT 1 OFFSET 5", HEAVY)
    waiting = await jobs.fetch(conn, await conn.fetchval(
        "SELECT id FROM jobs WHERE account_id = $1 AND status = 'pending' ORDER BY created_at DESC LIMIT 1", HEAVY))
    assert waiting is not None
    middle = await conn.fetchrow("SELECT created_at, id FROM jobs WHERE account_id = $1 ORDER BY created_at DESC "
                                 "OFFSET (SELECT count(*) / 2 FROM jobs WHERE account_id = $1) LIMIT 1", HEAVY)
    unlimited = ProviderLimits(concurrency=10_000, rate_per_s=1e9, burst=10**9)

    async def decide(c: asyncpg.Connection) -> Any:
        await slots.lock_provider(c, "fake")
        return await slots.choose(c, waiting, unlimited, CLAIM_TTL_S)

    return {
        "job GET (finished)": lambda c: c.fetchrow(tenant._ONE_JOB, finished, HEAVY),
        "job GET (waiting, with its place)": lambda c: c.fetchrow(tenant._ONE_JOB, waiting.id, HEAVY),
        "list page (newest 20)": lambda c: page(c, None),
        "list page (halfway down)": lambda c: page(c, (middle["created_at"], middle["id"])),
        "queue count at create": lambda c: queue_count(c, HEAVY, jobs.Lane.INTERACTIVE),
        "due-poll scan": rolled_back(lambda c: schedule.take_due(c, 100)),
        "recovery sweep": lambda c: c.fetch(sweep.OVERDUE_SQL, sweep.OVERDUE_S, 500),
        "retention sweep": rolled_back(lambda c: c.fetch(retention._DUE, 30 * 86400.0, retention.BATCH,
                                                          False, retention.warning_lead_s(Settings()))),
        "slot decision": rolled_back(decide),
        # What a waiting job's estimate reads, once per refresh interval per process (vidjobs.common.estimates).
        "estimate: a model's renders": lambda c: estimates.read_measured(c, "fake/default", Settings()),
        "estimate: a provider's queue": lambda c: estimates.read_queue(c, "fake"),
    }


async def page(conn: asyncpg.Connection, after: tuple[Any, str] | None) -> list[asyncpg.Record]:
    """The heavy account's listing as the gateway reads it: 20 jobs, newest first, after `after`."""
    sql, values = tenant.page_sql(tenant.JobFilter(), after)
    return await conn.fetch(sql, HEAVY, 20, *values)


async def timed(conn: asyncpg.Connection, op: Operation, runs: int) -> list[float]:
    await op(conn)
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await op(conn)
        took.append((time.perf_counter() - t0) * 1000)
    return took


_EXPLAINABLE = ("SELECT", "WITH", "UPDATE", "INSERT", "DELETE")
_WATCHED = {"jobs", "provider_submissions", "poll_schedule", "assets"}


async def plan_of(conn: asyncpg.Connection, op: Operation) -> str:
    """The scans of the watched tables in the plans of every statement `op` sends."""
    sent: list[tuple[str, tuple]] = []

    def keep(query: Any) -> None:
        sent.append((query.query, query.args))

    conn.add_query_logger(keep)
    try:
        await op(conn)
        await asyncio.sleep(0)  # asyncpg hands each statement to its loggers on the loop's next turn
    finally:
        conn.remove_query_logger(keep)
    scans: list[str] = []
    for query, args in sent:
        if not query.lstrip().upper().startswith(_EXPLAINABLE):
            continue
        tx = conn.transaction()
        await tx.start()
        try:
            raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + query, *args)
        finally:
            await tx.rollback()
        _scans(msgspec.json.decode(raw)[0]["Plan"], scans)
    return "; ".join(dict.fromkeys(scans)) or "no scan of a watched table"


def _scans(node: dict, out: list[str]) -> None:
    if node.get("Relation Name") in _WATCHED:
        index = node.get("Index Name")
        out.append(f"{node['Node Type']} {index}" if index else f"{node['Node Type']} on {node['Relation Name']}")
    for child in node.get("Plans", []):
        _scans(child, out)


async def run(admin_url: str, sizes: list[int], runs: int) -> None:
    name, url = await scratch_database(admin_url)
    try:
        await db.migrate(url)
        pool = await db.create_pool(url, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                await measure_all(conn, sizes, runs)
        finally:
            await pool.close()
    finally:
        await drop_database(admin_url, name)


async def measure_all(conn: asyncpg.Connection, sizes: list[int], runs: int) -> None:
    await setup(conn)
    results: dict[str, list[tuple[float, float]]] = {}
    plans: dict[str, dict[int, str]] = {}
    have = 0
    for size in sizes:
        print(f"growing to {size:,} jobs ...", file=sys.stderr, flush=True)
        await grow(conn, have, size)
        have = size
        await fresh_small_tables(conn)
        for label, op in (await operations(conn)).items():
            took = await timed(conn, op, runs)
            q = statistics.quantiles(took, n=100)
            results.setdefault(label, []).append((q[49], q[98]))
            plans.setdefault(label, {})[size] = await plan_of(conn, op)
    report(sizes, results, plans)


def report(sizes: list[int], results: dict[str, list[tuple[float, float]]], plans: dict[str, dict[int, str]]) -> None:
    head = "".join(f"{f'{s:,} p50 / p99':>22}" for s in sizes)
    print(f"{'operation (ms)':<34}{head}{'p50 ratio':>11}")
    for label, figures in results.items():
        cells = "".join(f"{f'{p50:.2f} / {p99:.2f}':>22}" for p50, p99 in figures)
        print(f"{label:<34}{cells}{figures[-1][0] / figures[0][0]:>10.2f}x")
    print("\nplans (scans of jobs, provider_submissions, poll_schedule and assets), at the largest size:")
    for label, by_size in plans.items():
        last = by_size[sizes[-1]]
        changed = "" if len(set(by_size.values())) == 1 else f"   (at {sizes[0]:,}: {by_size[sizes[0]]})"
        print(f"  {label}: {last}{changed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="total jobs, ascending, comma-separated")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per operation and size")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    admin_url = os.environ.get("VIDJOBS_DATABASE_URL")
    if admin_url:
        asyncio.run(run(admin_url, sizes, args.runs))
        return
    from vidjobs.cli.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg").start()
        try:
            asyncio.run(run(server.url, sizes, args.runs))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
