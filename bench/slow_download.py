"""One large render through the whole stack: the media worker's memory while it copies, and the copy's time.

    python bench/slow_download.py                      # a 500 MB render, served as fast as it goes
    python bench/slow_download.py --mb 500 --kbps 1000 # the same at 1 MB/s, as from a slow provider (~9 min)

The fake provider pads its MP4 to `--mb` megabytes (`params.output_mb`) and paces it (`serve_kb_per_s`).
Prints the media worker's resident memory at the start, at most and at the end (sampled, and the kernel's
peak), how long the copy took, and how the job ended.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def run(args: argparse.Namespace) -> None:
    from bench import cpu
    from bench.lifecycle import own_stack

    params: dict[str, object] = {"render_s": 0, "output_mb": args.mb}
    if args.kbps:
        params["serve_kb_per_s"] = args.kbps
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-") as tmp:
        async with own_stack(Path(tmp), max_download_bytes=(args.mb + 16) * 1_000_000) as (url, key, _), \
                aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            body = {"model": "fake/default", "prompt": "a large render", "duration_s": 1, "seed": 7, "params": params}
            rss = cpu.RssWatch("media")
            started = time.monotonic()
            async with http.post(f"{url}/v1/jobs", json=body) as resp:
                job = await resp.json()
            while job["stage"] not in ("ready", "failed", "canceled", "expired"):
                await asyncio.sleep(1)
                async with http.get(f"{url}/v1/jobs/{job['id']}") as resp:
                    job = await resp.json()
            took = time.monotonic() - started
            print(f"{args.mb} MB render{f' at {args.kbps:g} kB/s' if args.kbps else ''}: {job['status']} "
                  f"in {took:.1f} s ({args.mb / took:.1f} MB/s)" + (f", {job['error']}" if job.get("error") else ""))
            print(rss.stop())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=500, help="the render's size in megabytes (default 500)")
    parser.add_argument("--kbps", type=float, help="serve it at this many kilobytes a second (default: unpaced)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
