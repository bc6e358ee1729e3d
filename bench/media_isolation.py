"""Does a burst of transcodes slow downloads or the event loop? Three runs of one download, measured in one go:

    python bench/media_isolation.py [--mb 64] [--burst 8]

1. the download alone;
2. the download while `--burst` renders are verified, thumbnailed and previewed on the media service's own
   transcode pool (2 threads, as `VIDJOBS_MEDIA_CONCURRENCY` sets by default) - how the service runs;
3. the same burst on the event loop's default executor, which the download writes its chunks through - what
   the service would do without its own pool.

For each it prints the download's time and the event loop's lag (how late a 10 ms timer fires: p50, p99,
max), so the ratios between runs can be compared on a busy machine. The renders are real 720p H.264 clips.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vidjobs.fakeprovider.clips import ClipSpec, encode  # noqa: E402
from vidjobs.media.download import fetch_to_file  # noqa: E402
from vidjobs.media.pipeline import PreviewSpec, derive  # noqa: E402

CHUNK = bytes(1 << 20)


async def serve_bytes(total: int) -> tuple[web.AppRunner, str]:
    async def body(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(total), "Content-Type": "video/mp4"})
        await resp.prepare(request)
        for start in range(0, total, len(CHUNK)):
            await resp.write(CHUNK[: min(len(CHUNK), total - start)])
        return resp

    app = web.Application()
    app.router.add_get("/render.mp4", body)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/render.mp4"


async def loop_lag(stop: asyncio.Event, lags: list[float], tick_s: float = 0.01) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(tick_s)
        lags.append(time.perf_counter() - before - tick_s)


async def measured(download: Callable[[], Awaitable[None]]) -> tuple[float, list[float]]:
    stop, lags = asyncio.Event(), []
    ticker = asyncio.create_task(loop_lag(stop, lags))
    started = time.perf_counter()
    await download()
    elapsed = time.perf_counter() - started
    stop.set()
    await ticker
    return elapsed, lags


def burst(executor: Executor | None, clip: Path, work: Path, count: int) -> list[asyncio.Future]:
    loop = asyncio.get_running_loop()
    jobs = []
    for n in range(count):
        folder = work / f"t{n}"
        folder.mkdir(exist_ok=True)
        jobs.append(loop.run_in_executor(executor, derive, clip, folder, PreviewSpec()))
    return jobs


def row(name: str, elapsed: float, lags: list[float], base: float) -> str:
    ms = sorted(x * 1000 for x in lags) or [0.0]
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (f"{name:<42} {elapsed:7.2f} s  x{elapsed / base:5.2f}   lag p50 {statistics.median(ms):6.1f} ms"
            f"  p99 {p99:7.1f} ms  max {ms[-1]:7.1f} ms")


async def main(mb: int, count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-") as tmp:
        work = Path(tmp)
        clip = work / "clip.mp4"
        clip.write_bytes(await asyncio.to_thread(encode, ClipSpec(width=1280, height=720, duration_s=4, seed=1)))
        runner, url = await serve_bytes(mb * 1_000_000)
        transcoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="transcode")
        try:
            async with aiohttp.ClientSession() as session:
                async def download() -> None:
                    await fetch_to_file(session, url, work / "copy.mp4", headers={}, max_bytes=1 << 40,
                                        timeout_s=600)

                started = time.perf_counter()
                await asyncio.gather(*burst(transcoder, clip, work, 2))
                one = (time.perf_counter() - started) / 2
                print(f"one 720p render verified + thumbnailed + previewed: {one:.2f} s; download {mb} MB; "
                      f"burst of {count}")
                base, lags = await measured(download)
                print(row("download alone", base, lags, base))
                for name, executor in (("with burst on the transcode pool (2 thr.)", transcoder),
                                       ("with burst on the default executor", None)):
                    pending = burst(executor, clip, work, count)
                    elapsed, lags = await measured(download)
                    print(row(name, elapsed, lags, base))
                    await asyncio.gather(*pending)
        finally:
            transcoder.shutdown(wait=True)
            await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64, help="size of the download, in MB")
    parser.add_argument("--burst", type=int, default=8, help="renders transcoded meanwhile")
    args = parser.parse_args()
    asyncio.run(main(args.mb, args.burst))
