"""What one slot decision costs as queues grow: the submitter's fair pick, measured on a real PostgreSQL.

    python bench/dispatch.py [--depths 10,1000,10000] [--accounts 20] [--runs 300]

For each depth, one busy account has that many jobs waiting for the fake provider and `--accounts` others
have one each; a few renders are in flight. A run is one whole decision as the submitter makes it, under the
provider's lock: the switch, the breaker, the provider's cap, the fair head, the chosen account's cap, a
rate token. It is rolled back, so every run sees the same queue. Prints p50 / p99 / max in milliseconds, so
depths can be compared with each other in one go on a busy machine.

Uses VIDJOBS_DATABASE_URL when set (a scratch database is created and dropped there), else an embedded
PostgreSQL from the pgserver wheel.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vidjobs.common import db, jobs  # noqa: E402
from vidjobs.common.settings import ProviderLimits  # noqa: E402
from vidjobs.submitter import slots  # noqa: E402

REQUEST = {"model": "fake/default", "prompt": "bench", "duration_s": 1}


async def fill(conn: asyncpg.Connection, depth: int, others: int) -> str:
    """Accounts and waiting jobs; returns the id of the busy account's last job (the one whose message is
    handled: the worst case, deepest in its queue)."""
    await conn.execute("INSERT INTO accounts (id, name, concurrent_jobs) VALUES ('acct_busy', 'busy', 4)")
    await conn.execute(
        "INSERT INTO accounts (id, name) SELECT 'acct_' || i, 'other ' || i FROM generate_series(1, $1) i", others)
    await conn.execute(
        """
        INSERT INTO jobs (id, account_id, model, provider, request, created_at)
        SELECT 'job_b' || lpad(i::text, 8, '0'), 'acct_busy', 'fake/default', 'fake', $2::jsonb,
               now() - make_interval(secs => $1 - i)
        FROM generate_series(1, $1) i
        """,
        depth, REQUEST,
    )
    await conn.execute(
        """
        INSERT INTO jobs (id, account_id, model, provider, request)
        SELECT 'job_o' || i, 'acct_' || i, 'fake/default', 'fake', $2::jsonb FROM generate_series(1, $1) i
        """,
        others, REQUEST,
    )
    # A few renders in flight, some of them the busy account's.
    await conn.execute(
        "UPDATE jobs SET status = 'processing' WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT 3)")
    await conn.execute("ANALYZE jobs")
    return f"job_b{depth:08d}"


async def decide(conn: asyncpg.Connection, job: jobs.JobRow, provider_limits: ProviderLimits) -> str:
    tx = conn.transaction()
    await tx.start()
    try:
        await slots.lock_provider(conn, job.provider)
        choice = await slots.choose(conn, job, provider_limits, 45.0)
        return type(choice).__name__
    finally:
        await tx.rollback()


async def measure(url: str, depth: int, others: int, runs: int) -> tuple[list[float], str]:
    pool = await db.create_pool(url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            return await _timed(conn, depth, others, runs)
    finally:
        await pool.close()


async def _timed(conn: asyncpg.Connection, depth: int, others: int, runs: int) -> tuple[list[float], str]:
    handled = await jobs.fetch(conn, await fill(conn, depth, others))
    assert handled is not None
    provider_limits = ProviderLimits(concurrency=1000, rate_per_s=1e9, burst=10**9)
    outcome = await decide(conn, handled, provider_limits)  # warm the plan cache
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await decide(conn, handled, provider_limits)
        took.append((time.perf_counter() - t0) * 1000)
    return took, outcome


async def scratch_database(admin_url: str) -> tuple[str, str]:
    name = f"vidjobs_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    # Only the path names the database: a socket URL's query (`?host=/tmp/...`) holds slashes of its own.
    parts = urlsplit(admin_url)
    return name, urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def drop_database(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def run(admin_url: str, depths: list[int], others: int, runs: int) -> None:
    print(f"{'waiting (busy account)':>24} {'others':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  decision")
    for depth in depths:
        name, url = await scratch_database(admin_url)
        try:
            await db.migrate(url)
            took, outcome = await measure(url, depth, others, runs)
        finally:
            await drop_database(admin_url, name)
        q = statistics.quantiles(took, n=100)
        print(f"{depth:>24} {others:>7} {q[49]:>8.2f} {q[98]:>8.2f} {max(took):>8.2f}  {outcome}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="10,1000,10000", help="busy account's waiting jobs, comma-separated")
    parser.add_argument("--accounts", type=int, default=20, help="other accounts with one waiting job each")
    parser.add_argument("--runs", type=int, default=300, help="decisions timed per depth")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    admin_url = os.environ.get("VIDJOBS_DATABASE_URL")
    if admin_url:
        asyncio.run(run(admin_url, depths, args.accounts, args.runs))
        return
    from vidjobs.cli.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg").start()
        try:
            asyncio.run(run(server.url, depths, args.accounts, args.runs))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
