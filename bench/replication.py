"""`POST /v1/jobs` with the database replicated synchronously and asynchronously, side by side: a primary and a
streaming standby on loopback (tests/faults/replica.py), both with fsync on, the gateway in this process,
switched between the two modes round by round (`synchronous_standby_names` '*' or '').

    python bench/replication.py                   # 4 rounds of 10 s each side, 4 clients
    python bench/replication.py -c 8 --seconds 5 --rounds 5

Every round is printed (creates, p50, p99), then each mode's medians and their ratio. Loopback is the cheapest a
standby round trip can be: across zones each synchronous commit also waits one network round trip to the
standby (docs/PERFORMANCE.md "Replication").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JOB = {"model": "fake/default", "prompt": "a red fox in snow", "duration_s": 1}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def creates(h, key: str, clients: int, seconds: float) -> list[float]:
    """Latencies (ms) of creates sent back to back by `clients` clients for `seconds`; every one must be 201."""
    from tests.gateway_harness import auth

    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            resp = await h.client.post("/v1/jobs", json=JOB, headers=auth(key))
            await resp.read()
            if resp.status != 201:
                raise RuntimeError(f"create answered {resp.status}: {await resp.text()}")
            latencies.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


async def _account(h) -> str:
    return await h.key(credits=10**9, concurrency=64, requests_per_s=100_000.0, request_burst=100_000)


async def measure(home: Path, args: argparse.Namespace) -> None:
    from tests.faults.replica import ReplicatedPostgres
    from tests.gateway_harness import gateway_settings, running_gateway
    from vidjobs.cli.embedded import EmbeddedNats
    from vidjobs.common import db

    # fsync on, on both: a synchronous commit waits for the standby's flush, which is what it costs.
    pair = ReplicatedPostgres(home / "pg", synchronous=False, fsync=True).init().start()
    nats = EmbeddedNats(home / "nats").start()
    try:
        import asyncpg
        admin = await asyncpg.connect(pair.admin_url)
        await admin.execute('CREATE DATABASE "bench"')
        await admin.close()
        url = pair.url("bench")
        await db.migrate(url)
        settings = gateway_settings(home, url, nats.url, max_queued_jobs=10**9, log_level="WARNING")
        async with running_gateway(settings) as h:
            await creates(h, await _account(h), args.clients, 1.0)  # warm the pools and caches
            results: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
            for i in range(1, args.rounds + 1):
                # Each round's pair in the other order than the last, and each round on an account of its own
                # (a create reads its account's queue), so neither mode always meets the longer queue.
                for mode in ("sync", "async") if i % 2 else ("async", "sync"):
                    pair.set_synchronous(mode == "sync")
                    ms = await creates(h, await _account(h), args.clients, args.seconds)
                    p50, p99 = percentile(ms, 50), percentile(ms, 99)
                    results[mode].append((p50, p99))
                    print(f"round {i} {mode:5}: {len(ms):5d} creates  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms", flush=True)
    finally:
        nats.stop()
        pair.stop()
    medians = {m: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for m, rs in results.items()}
    for mode, (p50, p99) in medians.items():
        print(f"median {mode:5}: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    print(f"sync / async: p50 {medians['sync'][0] / medians['async'][0]:.2f}x  "
          f"p99 {medians['sync'][1] / medians['async'][1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--clients", type=int, default=4, help="creates in flight at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each mode, in turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-replication-") as tmp:
        asyncio.run(measure(Path(tmp), args))


if __name__ == "__main__":
    main()
