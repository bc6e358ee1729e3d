"""`GET /v1/jobs/{id}` beside the cheapest thing that could answer it: a bare aiohttp handler doing one asyncpg
primary-key SELECT of the same row, on the same database, loaded by the same client in the same sitting.

    python bench/reads.py                     # embedded stack, 64 connections, 3 rounds of 10 s each side
    python bench/reads.py -c 32 --seconds 5 --rounds 5

Rounds alternate (ours, bare, ours, bare, ...) and every round is printed, with requests per second, p50 and
p99; the ratio of the medians closes the report. The client runs in this process, so it takes CPU from both
sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BARE = r'''
import asyncio, json, os, sys
import asyncpg, uvloop
from aiohttp import web

async def main():
    pool = await asyncpg.create_pool(os.environ["BARE_DATABASE_URL"], min_size=4, max_size=10)

    async def one(request):
        row = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", request.match_info["id"])
        if row is None:
            raise web.HTTPNotFound()
        return web.json_response({k: (v if isinstance(v, (int, float, str, type(None))) else str(v))
                                  for k, v in row.items()})

    app = web.Application()
    app.router.add_get("/jobs/{id}", one)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(os.environ["BARE_PORT"])).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
'''


async def load(url: str, headers: dict[str, str], connections: int, seconds: float) -> tuple[float, list[float]]:
    """(requests per second, latencies in ms) of `connections` clients asking `url` over and over."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while (started := time.perf_counter()) < deadline:
                async with session.get(url, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{url} answered {resp.status}")
                latencies.append((time.perf_counter() - started) * 1000)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(connections)))
        return len(latencies) / (time.perf_counter() - began), latencies


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[round(q * 100) - 1]


@contextlib.contextmanager
def bare_server(database_url: str) -> object:
    from vidjobs.cli.embedded import free_port

    port = free_port()
    env = {**os.environ, "BARE_DATABASE_URL": database_url, "BARE_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-c", BARE], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def one_job(url: str, key: str) -> str:
    """A completed job to read (the fake provider renders it)."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "fake/default", "prompt": "a job to read", "duration_s": 1, "params": {"render_s": 0}}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/jobs", json=body, headers=headers) as resp:
            job_id = (await resp.json())["id"]
        for _ in range(200):
            async with session.get(f"{url}/v1/jobs/{job_id}", headers=headers) as resp:
                if (await resp.json())["status"] == "completed":
                    return job_id
            await asyncio.sleep(0.1)
    raise RuntimeError("the job to read did not complete")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each side")
    args = parser.parse_args()
    from bench.lifecycle import own_stack

    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-http-") as tmp:
        async with own_stack(Path(tmp)) as (url, key, settings):
            job_id = await one_job(url, key)
            with bare_server(settings.database_url) as bare:
                sides = {"ours": (f"{url}/v1/jobs/{job_id}", {"Authorization": f"Bearer {key}"}),
                         "bare": (f"{bare}/jobs/{job_id}", {})}
                for target, headers in sides.values():  # warm: connections, statement caches
                    await load(target, headers, args.connections, 1.0)
                rates: dict[str, list[float]] = {"ours": [], "bare": []}
                for i in range(args.rounds):
                    for name, (target, headers) in sides.items():
                        rate, took = await load(target, headers, args.connections, args.seconds)
                        rates[name].append(rate)
                        print(f"round {i + 1} {name}: {rate:7.0f} req/s  p50 {quantile(took, 0.5):6.1f} ms  "
                              f"p99 {quantile(took, 0.99):6.1f} ms", flush=True)
                ratio = statistics.median(rates["ours"]) / statistics.median(rates["bare"])
                print(f"GET /v1/jobs/{{id}} / bare SELECT handler, median req/s: {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
