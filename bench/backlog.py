"""A backlog behind a provider's small quota: what waiting costs, and how the queue drains once it can move.

    python bench/backlog.py                                   # 1k, 10k and 100k waiting across 1,000 accounts
    python bench/backlog.py --sizes 1000,10000 --measure-s 60 # a shorter sitting

For each size, on an embedded stack of its own (as `vidjobs up` builds it) with the fake provider limited to
`--quota` renders at once and `--quota` submissions a second:
1. `--quota` renders that never finish take every slot; creates and a waiting job's GET are timed against the empty
   queue, and the stack's idle CPU is read;
2. the backlog is queued across `--accounts` accounts, through the same `creation.enqueue` a create runs (its
   reservation, audit row and messages), and allowed to settle past every job's first recovery check;
3. CPU by process is read over `--measure-s` while nothing can move (every slot held), beside JetStream's
   bytes and the rows each waiting job holds, and creates and GETs are timed again;
4. those renders are canceled: the drain rate over `--drain-s` against the quota, then how many other
   jobs are handed a slot before a new account's first job (by then every account had its turn when the
   window is at least accounts / quota seconds: the fair order puts an account never served first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import cpu  # noqa: E402
from bench.dispatch import drop_database, scratch_database  # noqa: E402
from bench.lifecycle import percentile  # noqa: E402

# Renders that never finish (until canceled) hold the slots; their deadline is set past any sitting.
HOLD = {"model": "fake/default", "prompt": "holds a slot", "duration_s": 1, "seed": 7, "params": {"scenario": "hang"}}
QUICK = {"model": "fake/default", "prompt": "one second", "duration_s": 1, "seed": 7, "params": {"render_s": 1}}
ENQUEUE_CONNECTIONS = 8


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def stack(data_dir: Path, quota: int):
    from vidjobs.cli.embedded import free_port
    from vidjobs.cli.supervisor import Supervisor
    from vidjobs.cli.up import Embedded, resolve, wait_ready
    from vidjobs.common import db
    from vidjobs.common.settings import ProviderLimits, load

    embedded, given = Embedded(), load()
    # On a server of the caller's (VIDJOBS_DATABASE_URL), a scratch database of its own, dropped after.
    scratch = await scratch_database(given.database_url) if given.database_url else None
    try:
        limits = {"fake": ProviderLimits(concurrency=quota, rate_per_s=float(quota), burst=quota)}
        settings = resolve(given.with_(data_dir=str(data_dir), http_port=free_port(), log_level="WARNING",
                                       provider_limits=limits, max_queued_jobs=10**9, render_deadline_s=86400.0,
                                       **({"database_url": scratch[1]} if scratch else {})), embedded)
        await db.migrate(settings.database_url)
        supervisor = Supervisor(settings.to_env())
        await supervisor.start_all()
        try:
            await wait_ready(settings.gateway_url, supervisor)
            yield settings
        finally:
            await supervisor.close()
    finally:
        embedded.stop()
        if scratch:
            await drop_database(given.database_url, scratch[0])


async def new_accounts(database_url: str, count: int, prefix: str, concurrency: int = 2) -> list[tuple[str, str]]:
    from vidjobs.gateway.accounts import create_account

    conn = await asyncpg.connect(database_url)
    try:
        made = []
        for n in range(count):
            async with conn.transaction():
                made.append(await create_account(conn, f"{prefix}-{n}", credits=10**9, concurrency=concurrency,
                                                  requests_per_s=100_000.0, request_burst=100_000))
        return made
    finally:
        await conn.close()


async def api(session: aiohttp.ClientSession, method: str, url: str, key: str, body: dict | None = None) -> dict:
    async with session.request(method, url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        data = await resp.json()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {url} answered {resp.status}: {data}")
        return data


async def wait_for(predicate, what: str, within: float = 3600.0, every: float = 0.5) -> None:
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(every)


async def count(database_url: str, sql: str, *args: object) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def timed_requests(session: aiohttp.ClientSession, base: str, key: str, n: int) -> tuple[float, float]:
    """(create p50, a waiting job's GET p50), in milliseconds, one request at a time."""
    creates, gets = [], []
    job_id = ""
    for _ in range(n):
        started = time.perf_counter()
        job_id = (await api(session, "POST", f"{base}/v1/jobs", key, QUICK))["id"]
        creates.append((time.perf_counter() - started) * 1000)
    for _ in range(n):
        started = time.perf_counter()
        await api(session, "GET", f"{base}/v1/jobs/{job_id}", key)
        gets.append((time.perf_counter() - started) * 1000)
    return percentile(creates, 50), percentile(gets, 50)


async def enqueue_backlog(database_url: str, accounts: list[tuple[str, str]], size: int) -> None:
    """`size` waiting jobs, round robin over the accounts, as a create queues them."""
    from vidjobs.common import creation, db
    from vidjobs.common.jobs import JobRequest

    request = JobRequest(model=QUICK["model"], prompt=QUICK["prompt"], duration_s=1, seed=7, params={"render_s": 1})
    pool = await asyncpg.create_pool(database_url, min_size=ENQUEUE_CONNECTIONS, max_size=ENQUEUE_CONNECTIONS,
                                     init=db.init_connection)
    done = 0

    async def one_lane(lane: int) -> None:
        nonlocal done
        async with pool.acquire() as conn:
            for n in range(lane, size, ENQUEUE_CONNECTIONS):
                async with conn.transaction():
                    await creation.enqueue(conn, account_id=accounts[n % len(accounts)][0], request=request,
                                           estimated_credits=10, recovery_delay_s=60.0)
                done += 1
                if done % 5000 == 0:
                    say(f"  {done}/{size} queued")

    try:
        await asyncio.gather(*(one_lane(lane) for lane in range(ENQUEUE_CONNECTIONS)))
    finally:
        await pool.close()


async def js_state(nats_url: str) -> tuple[int, int, int]:
    """(bytes held in the work stream, the submitter's pending, its unacknowledged)."""
    import nats

    from vidjobs.common import bus

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        stream = await js.stream_info(bus.WORK_STREAM)
        consumer = await js.consumer_info(bus.WORK_STREAM, "submitter")
        return stream.state.bytes, consumer.num_pending, consumer.num_ack_pending
    finally:
        await nc.close()


async def cores_over(data_dir: Path, seconds: float) -> dict[str, float]:
    before = cpu.snapshot(data_dir)
    await asyncio.sleep(seconds)
    spent = cpu.usage(before, cpu.snapshot(data_dir))
    for note in spent.notes:
        say(f"  note: {note}")
    return {part: spent.seconds[part] / seconds for part in sorted(spent.seconds)}


ROWS = ("jobs", "job_transitions", "credit_ledger", "outbox", "recovery_leases", "provider_submissions")


async def rows_held(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        return {table: await conn.fetchval(f"SELECT count(*) FROM {table}") for table in ROWS}
    finally:
        await conn.close()


async def one_size(size: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="vidjobs-backlog-") as tmp:
        data_dir = Path(tmp)
        async with stack(data_dir, args.quota) as settings, aiohttp.ClientSession() as session:
            base, db_url = settings.gateway_url, settings.database_url
            # The holder may take every slot; the others have the default cap of 2.
            (_, holder), = await new_accounts(db_url, 1, "holder", concurrency=args.quota)
            (_, timer), (_, newcomer) = await new_accounts(db_url, 2, "bench")
            holds = [(await api(session, "POST", f"{base}/v1/jobs", holder, HOLD))["id"] for _ in range(args.quota)]
            await wait_for(lambda: _rendering(db_url, holds), "every slot to be taken")
            empty_create, empty_get = await timed_requests(session, base, timer, args.requests)
            idle = await cores_over(data_dir, args.idle_s)
            rows_before = await rows_held(db_url)
            say(f"size {size}: queueing across {args.accounts} accounts ...")
            accounts = await new_accounts(db_url, args.accounts, "backlog")
            await enqueue_backlog(db_url, accounts, size)
            await wait_for(lambda: _handled(settings), "every queued job's message to be handled once")
            say(f"  settling {args.settle_s:.0f} s past the first recovery checks ...")
            await asyncio.sleep(args.settle_s)
            say(f"  measuring {args.measure_s:.0f} s while nothing can move ...")
            waiting = await cores_over(data_dir, args.measure_s)
            js_bytes, js_pending, js_unacked = await js_state(settings.nats_url)
            rows_after = await rows_held(db_url)
            full_create, full_get = await timed_requests(session, base, timer, args.requests)
            drain, ahead = await drain_and_newcomer(session, settings, holds, holder, newcomer, args)
    return {"size": size, "idle": idle, "waiting": waiting, "js_bytes": js_bytes,
            "js_messages": js_pending + js_unacked, "drain": drain, "ahead": ahead,
            "rows": {t: (rows_after[t] - rows_before[t]) / size for t in ROWS},
            "create": (empty_create, full_create), "get": (empty_get, full_get)}


async def _rendering(database_url: str, ids: list[str]) -> bool:
    return await count(database_url, "SELECT count(*) FROM jobs WHERE id = ANY($1) "
                                     "AND status IN ('submitted', 'processing')", ids) == len(ids)


async def _handled(settings) -> bool:
    outbox = await count(settings.database_url, "SELECT count(*) FROM outbox")
    _, pending, _ = await js_state(settings.nats_url)
    return outbox == 0 and pending == 0


async def drain_and_newcomer(session: aiohttp.ClientSession, settings, holds: list[str], holder: str,
                             newcomer: str, args: argparse.Namespace) -> tuple[float, int]:
    """(submissions a second over the drain window / the quota's rate, jobs handed a slot between a new
    account's first create, made once the drain has run its window, and its own submission)."""
    base, db_url = settings.gateway_url, settings.database_url
    for job_id in holds:
        await api(session, "POST", f"{base}/v1/jobs/{job_id}/cancel", holder)
    started = time.monotonic()
    await asyncio.sleep(args.drain_s)
    window = time.monotonic() - started
    submitted = await count(db_url, "SELECT count(*) FROM job_transitions WHERE to_status = 'submitted' AND "
                                    "at > now() - make_interval(secs => $1)", window)
    mine = await api(session, "POST", f"{base}/v1/jobs", newcomer, QUICK)
    await wait_for(lambda: _submitted(db_url, mine["id"]), "the new account's first job", within=600)
    ahead = await count(db_url, """
        SELECT count(*) FROM job_transitions t WHERE t.to_status = 'submitted' AND t.job_id <> $1
          AND t.at > (SELECT created_at FROM jobs WHERE id = $1)
          AND t.at < (SELECT min(at) FROM job_transitions WHERE job_id = $1 AND to_status = 'submitted')""",
                        mine["id"])
    return submitted / window / args.quota, ahead


async def _submitted(database_url: str, job_id: str) -> bool:
    return bool(await count(database_url, "SELECT count(*) FROM job_transitions WHERE job_id = $1 "
                                          "AND to_status = 'submitted'", job_id))


def report(results: list[dict]) -> None:
    parts = sorted({p for r in results for p in (*r["idle"], *r["waiting"])})
    print("CPU above idle while nothing can move, in cores:")
    print(f"  {'waiting':>9}  " + "  ".join(f"{p[:10]:>10}" for p in parts) + f"  {'total':>7}")
    for r in results:
        above = {p: r["waiting"].get(p, 0.0) - r["idle"].get(p, 0.0) for p in parts}
        print(f"  {r['size']:>9}  " + "  ".join(f"{above[p]:>10.3f}" for p in parts)
              + f"  {sum(above.values()):>7.3f}")
    print("while waiting, and once the slots free:")
    print(f"  {'waiting':>9}  {'JS bytes':>10}  {'JS msgs':>8}  {'rows/job':>8}  {'drain':>6}  {'ahead':>5}  "
          f"{'create p50 ms':>16}  {'GET p50 ms':>16}")
    for r in results:
        rows = sum(r["rows"].values())
        print(f"  {r['size']:>9}  {r['js_bytes']:>10}  {r['js_messages']:>8}  {rows:>8.2f}  {r['drain']:>6.2f}  "
              f"{r['ahead']:>5}  {r['create'][0]:>6.1f} -> {r['create'][1]:>6.1f}  "
              f"{r['get'][0]:>6.1f} -> {r['get'][1]:>6.1f}")
    for r in results:
        print(f"rows per waiting job at {r['size']}: " + ", ".join(f"{t} {v:.2f}" for t, v in r["rows"].items()))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000", help="backlog sizes, comma-separated")
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--quota", type=int, default=10, help="renders at once and submissions a second")
    parser.add_argument("--idle-s", type=float, default=20.0, help="how long the idle stack is read")
    parser.add_argument("--settle-s", type=float, default=70.0,
                        help="wait after queueing: past the first recovery check (60 s) and a waiting job's look")
    parser.add_argument("--measure-s", type=float, default=60.0)
    parser.add_argument("--drain-s", type=float, default=120.0, help="at least accounts / quota")
    parser.add_argument("--requests", type=int, default=50, help="timed creates and GETs, each side")
    args = parser.parse_args()
    results = [await one_size(int(size), args) for size in args.sizes.split(",")]
    report(results)


if __name__ == "__main__":
    asyncio.run(main())
