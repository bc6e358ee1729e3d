"""Push N render jobs through a running stack and report throughput and create→ready latency.

    python bench/lifecycle.py -n 500                      # starts its own embedded stack in a temp dir
    python bench/lifecycle.py -n 500 --url URL --api-key KEY   # against a stack that is already running
    python bench/lifecycle.py -n 200 --serial             # one job at a time: create -> ready latency
    python bench/lifecycle.py -n 1000 --rate 20           # 20 creates a second, open loop: latency under load
    python bench/lifecycle.py -n 300 --statements         # PostgreSQL statements per job (not a timed run)
    python bench/lifecycle.py -n 100 --clip 1080p         # production-sized media: 10 s 1080p clips (720p too)

Jobs use the fake provider with an instant render, so the figures measure vidjobs itself: API, queues,
workers, database, storage. By default its clips are tiny (320×180, 12 fps: media costs a few ms); with
`--clip 720p` or `--clip 1080p` they are real 10 s clips at 24 fps and a provider's bitrate (~6 and ~10 MB),
encoded once before the run (every job asks for the same clip), so the media worker does a real job's work.
Latency is taken from the server's own timestamps (created_at to the
completed transition), so the client's polling interval does not blur it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# A fixed seed lets the fake provider encode the clip once, so its CPU does not crowd out what is measured.
BODY: dict[str, Any] = {"model": "fake/default", "prompt": "benchmark clip", "duration_s": 1, "seed": 7,
                        "params": {"render_s": 0}}
REAL_DURATION_S = 10


def use_clip(clip: str) -> None:
    """Every job asks for a real clip of this resolution (or the tiny one)."""
    if clip != "tiny":
        BODY.update(duration_s=REAL_DURATION_S, resolution=clip, aspect_ratio="16:9",
                    params={"render_s": 0, "clip": "real"})


async def encode_ahead(clip: str, clip_dir: str) -> None:
    """Make the run's one real clip before the clock starts, where the fake provider will find it."""
    from vidjobs.fakeprovider.clip_cache import ClipCache
    from vidjobs.fakeprovider.clips import real_spec

    if clip != "tiny":
        print(f"encoding the {clip} clip (once) ...", file=sys.stderr, flush=True)
        await ClipCache(Path(clip_dir), 1 << 40).get(real_spec("16:9", clip, REAL_DURATION_S, BODY["seed"]))
TERMINAL_STAGES = ("ready", "failed", "canceled", "expired")


async def create_one(session: aiohttp.ClientSession, url: str, key: str) -> str:
    async with session.post(f"{url}/v1/jobs", json=BODY, headers={"Authorization": f"Bearer {key}"}) as resp:
        data = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"create failed with {resp.status}: {data}")
        return data["id"]


async def create_all(session: aiohttp.ClientSession, url: str, key: str, n: int, parallel: int) -> list[str]:
    slots = asyncio.Semaphore(parallel)

    async def one() -> str:
        async with slots:
            return await create_one(session, url, key)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def create_at_rate(session: aiohttp.ClientSession, url: str, key: str, n: int, rate: float) -> list[str]:
    """Open loop: one create every 1/rate s whatever the stack's answers, so a slow stack meets its queue."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for i in range(n):
        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        tasks.append(asyncio.ensure_future(create_one(session, url, key)))
    return list(await asyncio.gather(*tasks))


async def run_serial(session: aiohttp.ClientSession, url: str, key: str, n: int) -> dict[str, dict]:
    """One job at a time: create it, read it every 2 ms until it is terminal, then the next."""
    headers = {"Authorization": f"Bearer {key}"}
    done: dict[str, dict] = {}
    for i in range(n):
        job_id = await create_one(session, url, key)
        while True:
            async with session.get(f"{url}/v1/jobs/{job_id}", headers=headers) as resp:
                job = await resp.json()
            if job["stage"] in TERMINAL_STAGES:
                done[job_id] = job
                break
            await asyncio.sleep(0.002)
        if i % 50 == 49:
            print(f"  {i + 1}/{n} jobs finished", file=sys.stderr, flush=True)
    return done


async def wait_all(session: aiohttp.ClientSession, url: str, key: str, ids: list[str]) -> dict[str, dict]:
    """Poll the listing until every job is terminal, printing progress as it goes."""
    headers = {"Authorization": f"Bearer {key}"}
    wanted, done = set(ids), {}
    last_report = 0.0
    while len(done) < len(wanted):
        cursor = None
        while True:
            params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
            async with session.get(f"{url}/v1/jobs", params=params, headers=headers) as resp:
                page = await resp.json()
            for job in page["data"]:
                if job["id"] in wanted and job["stage"] in TERMINAL_STAGES:
                    done[job["id"]] = job
            cursor = page["next_cursor"]
            if not cursor:
                break
        if time.monotonic() - last_report > 2:
            print(f"  {len(done)}/{len(wanted)} jobs finished", file=sys.stderr, flush=True)
            last_report = time.monotonic()
        if len(done) < len(wanted):
            await asyncio.sleep(0.5)
    return done


def report(jobs: dict[str, dict], wall_s: float) -> None:
    report_jobs(jobs, wall_s)
    copied = sum((j.get("outputs") or {}).get("bytes") or 0 for j in jobs.values())
    if copied:
        ts = datetime.fromisoformat
        span = (max(ts(j["updated_at"]) for j in jobs.values())
                - min(ts(j["created_at"]) for j in jobs.values())).total_seconds()
        print(f"copied: {copied / 1e6:.1f} MB of renders, {copied / 1e6 / span:.1f} MB/s")


def report_jobs(jobs: dict[str, dict], wall_s: float) -> None:
    ts = datetime.fromisoformat
    completed = [j for j in jobs.values() if j["status"] == "completed"]
    latencies = [(ts(j["updated_at"]) - ts(j["created_at"])).total_seconds() for j in completed]
    first = min(ts(j["created_at"]) for j in jobs.values())
    last = max(ts(j["updated_at"]) for j in jobs.values())
    span = (last - first).total_seconds()
    print(f"jobs: {len(jobs)}  completed: {len(completed)}  other: {len(jobs) - len(completed)}")
    print(f"throughput: {len(completed) / span:.1f} jobs/s (first create to last completion, {span:.1f} s)")
    print(f"create->ready p50 {percentile(latencies, 50):.3f} s  p95 {percentile(latencies, 95):.3f} s  "
          f"p99 {percentile(latencies, 99):.3f} s  mean {statistics.fmean(latencies):.3f} s")
    print(f"client wall time: {wall_s:.1f} s")


def report_cpu(spent: Any, jobs: int) -> None:
    from bench import cpu

    rows = cpu.per_job(spent, jobs)
    print("CPU per job (user + system, every process of the stack):")
    for part, ms in rows:
        print(f"  {part:<14} {ms:7.1f} ms")
    for note in spent.notes:
        print(f"  note: {note}")
    total = dict(rows).get("total", 0.0)
    if total:
        print(f"jobs/s per core: {1000 / total:.1f} (one core's second over the CPU a job costs)")


async def push(session: aiohttp.ClientSession, url: str, key: str, args: argparse.Namespace) -> dict[str, dict]:
    if args.serial:
        print(f"running {args.n} jobs one at a time ...", file=sys.stderr, flush=True)
        return await run_serial(session, url, key, args.n)
    if args.rate:
        print(f"creating {args.n} jobs at {args.rate}/s ...", file=sys.stderr, flush=True)
        ids = await create_at_rate(session, url, key, args.n, args.rate)
    else:
        print(f"creating {args.n} jobs ({args.parallel} in flight) ...", file=sys.stderr, flush=True)
        ids = await create_all(session, url, key, args.n, args.parallel)
    return await wait_all(session, url, key, ids)


async def run(url: str, key: str, args: argparse.Namespace, data_dir: Path | None = None,
              settings: Any = None) -> None:
    from bench import cpu, statements

    pg_log = data_dir / "postgres" / "log" if data_dir else None
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        before = cpu.snapshot(data_dir) if data_dir else None
        rss = cpu.RssWatch("media") if data_dir else None
        counts = (await cpu.database_counts(settings.database_url), await cpu.message_counts(settings.nats_url)) \
            if settings else None
        if args.statements and settings and pg_log:
            await statements.start_logging(settings.database_url)
            log_offset = pg_log.stat().st_size
        jobs = await push(session, url, key, args)
        report(jobs, time.monotonic() - started)
        if args.statements and settings and pg_log:
            await asyncio.sleep(1.0)  # let the relays and sweeps that follow the last job show up too
            await statements.stop_logging(settings.database_url)
            statements.report(statements.count(pg_log, log_offset), len(jobs))
        if before is not None and data_dir is not None:
            report_cpu(cpu.usage(before, cpu.snapshot(data_dir)), len(jobs))
        if rss is not None:
            print(rss.stop())
        if counts is not None:
            await asyncio.sleep(1.5)  # PostgreSQL sends its statistics at most once a second
            db = cpu.per_job_counts(counts[0], await cpu.database_counts(settings.database_url), len(jobs))
            messages = cpu.per_job_counts(counts[1], await cpu.message_counts(settings.nats_url), len(jobs))
            print("per job: " + ", ".join(f"{name} {value:.1f}" for name, value in db + messages))


@contextlib.asynccontextmanager
async def own_stack(data_dir: Path, **overrides: Any):
    """An embedded stack exactly as `vidjobs up` builds it, with an account allowed to run many jobs;
    `overrides` are settings."""
    from vidjobs.cli.embedded import free_port
    from vidjobs.cli.supervisor import Supervisor
    from vidjobs.cli.up import Embedded, resolve, wait_ready
    from vidjobs.common import db
    from vidjobs.common.settings import ProviderLimits, load

    # Tiny clips unless a job asks for a real one (--clip): `vidjobs up` on its own renders real ones.
    os.environ.setdefault("VIDJOBS_FAKE_CLIP", "tiny")
    embedded = Embedded()
    try:
        # The fake provider gets no caps, so the figures measure vidjobs rather than its politeness limits.
        unlimited = {"fake": ProviderLimits(concurrency=100_000, rate_per_s=100_000, burst=100_000)}
        settings = resolve(load().with_(data_dir=str(data_dir), http_port=free_port(), log_level="WARNING",
                                        provider_limits=unlimited, max_queued_jobs=10**9, **overrides), embedded)
        await db.migrate(settings.database_url)
        key = await bench_account(settings.database_url)
        supervisor = Supervisor(settings.to_env())
        await supervisor.start_all()
        try:
            await wait_ready(settings.gateway_url, supervisor)
            yield settings.gateway_url, key, settings
        finally:
            await supervisor.close()
    finally:
        embedded.stop()


async def bench_account(database_url: str) -> str:
    import asyncpg

    from vidjobs.gateway.accounts import create_account

    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            _, key = await create_account(conn, "bench", credits=10**9, concurrency=10_000,
                                          requests_per_s=100_000.0, request_burst=100_000)
        return key
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=500, help="jobs to push (default 500)")
    parser.add_argument("--parallel", type=int, default=32, help="creates in flight at once")
    parser.add_argument("--url", help="gateway of a running stack")
    parser.add_argument("--api-key", help="API key for --url")
    parser.add_argument("--serial", action="store_true", help="one job at a time (create -> ready latency)")
    parser.add_argument("--rate", type=float, help="creates per second, open loop, instead of --parallel")
    parser.add_argument("--statements", action="store_true",
                        help="count PostgreSQL statements per job from its log (own stack only; not a timed run)")
    parser.add_argument("--clip", choices=("tiny", "720p", "1080p"), default="tiny",
                        help="the clips jobs render: tiny (default) or real 10 s clips at this resolution")
    args = parser.parse_args()
    use_clip(args.clip)
    if args.url:
        if not args.api_key:
            parser.error("--url needs --api-key")
        await run(args.url, args.api_key, args)
        return
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-") as tmp:
        print("starting an embedded stack ...", file=sys.stderr, flush=True)
        clip_dir = str(Path(tmp) / "fake-clips")
        await encode_ahead(args.clip, clip_dir)
        async with own_stack(Path(tmp), fake_clip_dir=clip_dir) as (url, key, settings):
            await run(url, key, args, data_dir=Path(tmp), settings=settings)


if __name__ == "__main__":
    asyncio.run(main())
