"""What a rendering job's recovery checks cost and find, with the production defaults (recovery delay and
interval 60 s), on an embedded stack and the fake provider.

    python bench/recovery_calls.py --kind healthy|lost [--jobs 5] [--render-s 300] [--lost-render-s 90]

One kind of job per run (each run starts its own stack, so the poller's counter is that kind's alone):

  healthy  the provider calls back when the render starts and when it ends (scenario `succeed`), `--render-s`
           long: the status calls the recovery checks made per render (the poller's
           vidjobs_provider_calls_total{operation="status"}; no other poll runs for a provider with callbacks).
  lost     the provider never calls back (scenario `no_callback`), `--lost-render-s` long: how long after the
           render ended the job was found (its move to `downloading`), by a recovery check.

With --measured the model has 30 renders of that length behind it (copied from one real completed job), so
its checks start from the model's median render, as in production; without it the model is new.

Run it from two checkouts side by side to compare them; it takes about as long as the render.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import aiohttp
import asyncpg
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lifecycle import own_stack  # noqa: E402
from vidjobs.common.settings import Settings  # noqa: E402


def poller_metrics_url() -> str:
    """The poller's /metrics, found among this process's children (it binds a free port of its own)."""
    for child in psutil.Process().children(recursive=True):
        if any("vidjobs.poller" in part for part in child.cmdline()):
            ports = [c.laddr.port for c in child.net_connections() if c.status == "LISTEN"]
            return f"http://127.0.0.1:{ports[0]}/metrics"
    raise RuntimeError("no poller process found")


async def status_calls(session: aiohttp.ClientSession) -> float:
    async with session.get(poller_metrics_url()) as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vidjobs_provider_calls_total{") and 'operation="status"' in line)


async def create_done(session: aiohttp.ClientSession, url: str) -> str:
    """One short render to completion: the row the seeded measurements are copied from."""
    body = {"model": "fake/default", "prompt": "a fox", "duration_s": 1, "params": {"render_s": 0.1}}
    async with session.post(f"{url}/v1/jobs", json=body) as resp:
        job_id = str((await resp.json())["id"])
    while True:
        async with session.get(f"{url}/v1/jobs/{job_id}") as resp:
            if (await resp.json())["status"] == "completed":
                return job_id
        await asyncio.sleep(0.5)


async def seed_measurements(database_url: str, job_id: str, render_s: float, count: int = 30) -> None:
    """`count` completed renders of the model, each `render_s` long, copied from a real completed job: the
    model is then measured, as any model in production is after its first renders."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            """
            INSERT INTO jobs SELECT (jsonb_populate_record(NULL::jobs, to_jsonb(j) || jsonb_build_object(
                'id', j.id || '_m' || g, 'provider_job_id', NULL,
                'submitted_at', j.completed_at - make_interval(secs => $2),
                'rendered_at', j.completed_at))).*
            FROM jobs j, generate_series(1, $3) AS g WHERE j.id = $1
            """, job_id, render_s, count)
    finally:
        await conn.close()


async def run(url: str, key: str, args: argparse.Namespace, settings: Settings) -> None:
    scenario, render_s = ("succeed", args.render_s) if args.kind == "healthy" else ("no_callback", args.lost_render_s)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def create() -> str:
            body = {"model": "fake/default", "prompt": "a fox", "duration_s": 1,
                    "params": {"scenario": scenario, "render_s": render_s}}
            async with session.post(f"{url}/v1/jobs", json=body) as resp:
                assert resp.status == 201, await resp.text()
                return str((await resp.json())["id"])

        async def finished(job_id: str) -> str:
            while True:
                async with session.get(f"{url}/v1/jobs/{job_id}") as resp:
                    status = str((await resp.json())["status"])
                if status in ("completed", "failed", "canceled"):
                    return status
                await asyncio.sleep(2)

        async def found_after(job_id: str) -> float | None:
            async with session.get(f"{url}/v1/jobs/{job_id}/events") as resp:
                moves = (await resp.json())["data"]
            submitted = next(datetime.fromisoformat(m["at"]) for m in moves if m["to"] == "submitted")
            found = next((datetime.fromisoformat(m["at"]) for m in moves if m["to"] == "downloading"), None)
            return None if found is None else (found - submitted).total_seconds() - render_s

        if args.measured:
            await seed_measurements(settings.database_url, await create_done(session, url), render_s)
        ids = [await create() for _ in range(args.jobs)]
        print(f"{args.jobs} {args.kind} renders of {render_s:.0f} s running ...", file=sys.stderr, flush=True)
        endings = await asyncio.gather(*(finished(j) for j in ids))
        calls = await status_calls(session)
        late = [d for d in await asyncio.gather(*(found_after(j) for j in ids)) if d is not None]
    print(f"{args.kind}: endings {sorted(set(endings))}; {calls:.0f} status calls for {args.jobs} renders of "
          f"{render_s:.0f} s = {calls / args.jobs:.1f} per render")
    if args.kind == "lost" and late:
        print(f"lost: found after the render ended: p50 {statistics.median(late):.1f} s, max {max(late):.1f} s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=("healthy", "lost"), default="healthy")
    parser.add_argument("--jobs", type=int, default=5, help="jobs (default 5)")
    parser.add_argument("--render-s", type=float, default=300, help="a healthy render's length (default 300)")
    parser.add_argument("--measured", action="store_true",
                        help="seed 30 completed renders of the model at the render's length first (a model measured "
                             "here, as in production); without it the model is new (unmeasured)")
    parser.add_argument("--lost-render-s", type=float, default=90, help="a lost callback's render (default 90)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-") as tmp:
        print("starting an embedded stack ...", file=sys.stderr, flush=True)
        async with own_stack(Path(tmp)) as (url, key, _settings):
            await run(url, key, args, _settings)


if __name__ == "__main__":
    asyncio.run(main())
