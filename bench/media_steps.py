"""Where a media worker's CPU for one real clip goes: the copy's steps one at a time, in one process.

    python bench/media_steps.py                     # a 10 s 1080p clip, 10 rounds
    python bench/media_steps.py --clip 720p --rounds 20

Runs the media worker's own code for a copy, step by step, on the clip the fake provider serves for a
`--clip` job (bench/lifecycle.py's): the download (`fetch_to_file` over HTTP from a server in another
process, on the guarded session, hashing and writing as it goes), the derive (`pipeline.derive`: verify,
thumbnail and preview in one decode pass, on a transcoder thread) and the store (the three objects put into
file storage and read back for their size and SHA-256, as `vidjobs up` stores them). Each step's CPU is this
process's (every thread), from the kernel's accounting; the median of the rounds is printed with the range.

What is not here is the rest of a job in the media worker (the message, the copy lease, the job's transitions
and events, logging): bench/lifecycle.py's media CPU per job less the sum of these steps.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = ("download", "derive", "store")


def decode_first(video: Path, seconds: float) -> int:
    """Decode the video's frames up to `seconds`, one thread, and nothing else (the derive's floor)."""
    import av

    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        decoded = 0
        for frame in container.decode(stream):
            decoded += 1
            if (frame.time or 0.0) > seconds:
                break
    return decoded


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measured(step: Awaitable[Any]) -> tuple[Any, float, float]:
    """(the step's result, CPU ms of this process while it ran, wall ms)."""
    cpu0, wall0 = cpu_s(), time.perf_counter()
    result = await step
    return result, (cpu_s() - cpu0) * 1000, (time.perf_counter() - wall0) * 1000


async def clip_file(clip: str, directory: Path) -> Path:
    from bench.lifecycle import BODY, REAL_DURATION_S
    from vidjobs.fakeprovider.clip_cache import ClipCache
    from vidjobs.fakeprovider.clips import real_spec

    made = await ClipCache(directory, 1 << 40).get(real_spec("16:9", clip, REAL_DURATION_S, BODY["seed"]))
    served = directory / "served.mp4"
    served.write_bytes(made.read_bytes())
    return served


def start_server(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    from vidjobs.cli.embedded import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return server, port


async def wait_listening(port: int) -> None:
    for _ in range(100):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError("the clip server did not start")


async def rounds(args: argparse.Namespace, url: str, objects: Path, scratch: Path) -> dict[str, list[float]]:
    from vidjobs.common import netguard
    from vidjobs.media.download import fetch_to_file
    from vidjobs.media.pipeline import VIDEO_NAME, Copier, PreviewSpec
    from vidjobs.storage.filesystem import FileStorage

    storage = FileStorage(objects, base_url="http://127.0.0.1", secret="bench")
    transcoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transcode")
    cpu: dict[str, list[float]] = {step: [] for step in (*STEPS, "whole copy", "decode only")}
    wall: dict[str, list[float]] = {step: [] for step in cpu}
    async with netguard.guarded_session({url.split("/")[2]}) as session:
        copier = Copier(session=session, storage=storage, max_bytes=512 * 2**20, transcoder=transcoder,
                        preview=PreviewSpec())
        for n in range(args.rounds + 1):  # the first round warms caches and imports, and is not counted
            work = Path(tempfile.mkdtemp(dir=scratch))
            job = _job(n)
            fetched, c_dl, w_dl = await measured(fetch_to_file(
                session, url, work / VIDEO_NAME, headers={}, max_bytes=512 * 2**20, timeout_s=60))
            derived, c_dv, w_dv = await measured(copier.derive(fetched.path, work))
            _, c_st, w_st = await measured(copier._upload(job, fetched, derived))
            _, c_dec, w_dec = await measured(asyncio.to_thread(decode_first, fetched.path, copier.preview.seconds))
            if n:
                for step, c, w in zip(STEPS, (c_dl, c_dv, c_st), (w_dl, w_dv, w_st), strict=True):
                    cpu[step].append(c)
                    wall[step].append(w)
                cpu["whole copy"].append(c_dl + c_dv + c_st)
                cpu["decode only"].append(c_dec)
                wall["decode only"].append(w_dec)
                wall["whole copy"].append(w_dl + w_dv + w_st)
    transcoder.shutdown()
    await storage.close()
    return {**{f"{k} cpu": v for k, v in cpu.items()}, **{f"{k} wall": v for k, v in wall.items()}}


def _job(n: int) -> Any:
    """What a copy reads of its job row: the account and the job, for the stored objects' names."""
    return SimpleNamespace(id=f"job_bench{n:06d}", account_id="acct_bench")


def report(clip: str, size: int, figures: dict[str, list[float]]) -> None:
    print(f"{clip} clip, {size / 1e6:.1f} MB; CPU of this process (every thread) per step, ms: "
          f"median (min-max) over {len(figures['whole copy cpu'])} rounds; wall ms beside")
    for step in (*STEPS, "whole copy", "decode only"):
        c, w = figures[f"{step} cpu"], figures[f"{step} wall"]
        aside = "   (reference: not part of the copy)" if step == "decode only" else ""
        print(f"  {step:<11} cpu {statistics.median(c):7.1f} ({min(c):.1f}-{max(c):.1f})   "
              f"wall {statistics.median(w):7.1f}{aside}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip", choices=("720p", "1080p"), default="1080p")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidjobs-steps-") as tmp:
        root = Path(tmp)
        for sub in ("clips", "objects", "scratch"):
            (root / sub).mkdir()
        print(f"encoding the {args.clip} clip ...", file=sys.stderr, flush=True)
        served = await clip_file(args.clip, root / "clips")
        size = served.stat().st_size
        server, port = start_server(root / "clips")
        try:
            await wait_listening(port)
            figures = await rounds(args, f"http://127.0.0.1:{port}/{served.name}", root / "objects", root / "scratch")
        finally:
            server.terminate()
            server.wait()
    report(args.clip, size, figures)


if __name__ == "__main__":
    asyncio.run(main())
