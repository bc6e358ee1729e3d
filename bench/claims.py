"""What one webhook-delivery claim costs on a large backlog (services/gateway/appwebhooks/claims.py).

    python bench/claims.py [--deliveries 20000] [--accounts 50] [--busy-share 0.9] [--hosts 5000] [--runs 50]
                          [--cases open,full,hosts] [--plan]

Each account's pending deliveries are due, the oldest `--busy-share` of them on one host that every account
shares (busy.example), the rest on a host of the account's own. Three cases:

  open   busy.example has room: nothing is in flight.
  full   busy.example is at its cap: `host_in_flight` of its deliveries are claimed and unsettled.
  hosts  as `open`, and one more account has `--hosts` deliveries, each to a host of its own (a job's own
         webhook_url may name any host).

A run is one claim with the default caps and a batch of 64, rolled back, so every run sees the same backlog.
Prints p50 / p99 of the statement's time in milliseconds, what the claim took (and how many of those are off
busy.example), and the plan's execution time and shared buffers from one EXPLAIN (ANALYZE, BUFFERS).

Uses VIDJOBS_DATABASE_URL when set (a scratch database is created and dropped there), else an embedded
PostgreSQL from the pgserver wheel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dispatch import drop_database, scratch_database  # noqa: E402
from vidjobs.common import db  # noqa: E402
from vidjobs.common.settings import Settings  # noqa: E402
from vidjobs.gateway.accounts import create_account  # noqa: E402
from vidjobs.gateway.appwebhooks import claims  # noqa: E402

BATCH = 64
HOLD_S = 40.0
CASES = ("open", "full", "hosts")

_FILL = """
INSERT INTO webhook_deliveries (id, account_id, job_id, event_type, event_key, url, host, next_attempt_at)
SELECT 'msg_' || $1 || '_' || n, $2, 'job_' || n, 'job.completed', $1 || '_' || n, url, lower(host),
       clock_timestamp() - make_interval(secs => 100000 - n)
FROM generate_series(1, $3) AS n,
     LATERAL (SELECT CASE WHEN n <= $4 THEN 'busy.example' ELSE replace($5, '{n}', n::text) END) AS h (host),
     LATERAL (SELECT 'https://' || h.host || '/hook?n=' || n) AS u (url)
"""


async def fill(conn: asyncpg.Connection, case: str, deliveries: int, accounts: int, busy_share: float,
               hosts: int, host_in_flight: int) -> None:
    each = deliveries // accounts
    for i in range(accounts):
        account_id, _ = await create_account(conn, f"bench-{i}", credits=0, concurrency=1)
        await conn.execute(_FILL, f"a{i}", account_id, each, int(each * busy_share), f"own{i}.example")
    if case == "hosts":
        account_id, _ = await create_account(conn, "bench-hosts", credits=0, concurrency=1)
        await conn.execute(_FILL, "h", account_id, hosts, 0, "h{n}.example")
    if case == "full":
        await conn.execute("""UPDATE webhook_deliveries SET claimed_until = clock_timestamp() + interval '1 hour'
                              WHERE id IN (SELECT id FROM webhook_deliveries WHERE host = 'busy.example'
                                           ORDER BY next_attempt_at LIMIT $1)""", host_in_flight)
    await conn.execute("ANALYZE webhook_deliveries")


async def measure(url: str, case: str, args: argparse.Namespace) -> str:
    caps = claims.Caps.of(Settings())
    params = (BATCH, caps.in_flight, caps.per_minute, caps.host_in_flight, HOLD_S)
    conn = await asyncpg.connect(url)
    try:
        await fill(conn, case, args.deliveries, args.accounts, args.busy_share, args.hosts, caps.host_in_flight)
        took: list[float] = []
        rows: list[asyncpg.Record] = []
        for run in range(args.runs + 5):
            tr = conn.transaction()
            await tr.start()
            start = time.perf_counter()
            rows = await conn.fetch(claims._CLAIM, *params)
            if run >= 5:
                took.append((time.perf_counter() - start) * 1000)
            await tr.rollback()
        tr = conn.transaction()
        await tr.start()
        explain = f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {claims._CLAIM}"
        plan = json.loads(await conn.fetchval(explain, *params))
        await tr.rollback()
        if args.plan:
            tr = conn.transaction()
            await tr.start()
            text = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) {claims._CLAIM}", *params)
            await tr.rollback()
            print("\n".join(r[0] for r in text), file=sys.stderr)
    finally:
        await conn.close()
    top = plan[0]
    off_busy = sum(1 for r in rows if "//busy.example/" not in r["url"])
    q = statistics.quantiles(took, n=100)
    return (f"{case:>6} {q[49]:>8.2f} {q[98]:>8.2f} {len(rows):>6} {off_busy:>9} "
            f"{top['Execution Time']:>10.2f} {top['Plan'].get('Shared Hit Blocks', 0):>9}")


async def run(admin_url: str, args: argparse.Namespace) -> None:
    print(f"{'case':>6} {'p50 ms':>8} {'p99 ms':>8} {'taken':>6} {'off busy':>9} {'explain ms':>10} {'buffers':>9}")
    for case in args.cases.split(","):
        name, url = await scratch_database(admin_url)
        try:
            await db.migrate(url)
            print(await measure(url, case, args), flush=True)
        finally:
            await drop_database(admin_url, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=20000, help="pending deliveries over the accounts")
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument("--busy-share", type=float, default=0.9, help="each account's oldest, on busy.example")
    parser.add_argument("--hosts", type=int, default=5000, help="the `hosts` case's account's distinct hosts")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runs", type=int, default=50, help="claims timed per case")
    parser.add_argument("--plan", action="store_true", help="print each case's plan to stderr")
    args = parser.parse_args()
    admin_url = os.environ.get("VIDJOBS_DATABASE_URL")
    if admin_url:
        asyncio.run(run(admin_url, args))
        return
    from vidjobs.cli.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg").start()
        try:
            asyncio.run(run(server.url, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
