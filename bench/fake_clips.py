"""How long the fake provider takes to make a tiny clip (320 px, 12 fps: the test suite's default), the figure
docs/FAKE_PROVIDER.md gives as "tens of milliseconds": wall and CPU ms per clip of each length, each round a
seed not made before, so nothing comes from the clip cache.

    python bench/fake_clips.py                      # 20 rounds of 5 s and 10 s clips
    python bench/fake_clips.py --rounds 5 --durations 1,5,30

CPU is the process's own (user + system, every thread): the encoder runs on a worker thread.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_clip(duration_s: float, seed: int) -> tuple[float, float]:
    """(wall ms, CPU ms) to make one tiny 16:9 clip of `duration_s` seconds."""
    from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4

    spec = ClipSpec(*clip_size("16:9"), duration_s=duration_s, seed=seed)
    cpu0, wall0 = cpu_s(), time.perf_counter()
    await render_mp4(spec)
    return (time.perf_counter() - wall0) * 1000, (cpu_s() - cpu0) * 1000


async def main(rounds: int, durations: list[float]) -> None:
    seed = time.time_ns() % 2**31  # a fresh start each run, so no round finds its clip cached
    print(f"{'clip':>8}  {'wall ms median':>15}  {'(min-max)':>15}  {'cpu ms median':>14}  {'x real time':>11}")
    for duration_s in durations:
        walls, cpus = [], []
        for _ in range(rounds):
            seed += 1
            wall, cpu = await one_clip(duration_s, seed)
            walls.append(wall)
            cpus.append(cpu)
        median = statistics.median(walls)
        print(f"{duration_s:>6g} s  {median:>15.1f}  {min(walls):>7.1f}-{max(walls):<7.1f}  "
              f"{statistics.median(cpus):>14.1f}  {median / 1000 / duration_s:>11.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--durations", default="5,10", help="clip lengths in seconds, comma-separated")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, [float(d) for d in args.durations.split(",")]))
