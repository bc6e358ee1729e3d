"""CPU the media service spends deriving a render's assets: verify, thumbnail and preview (`derive`), on the
lifecycle benchmark's clip (1 s, 320x180, as the fake provider renders it) and on a 10 s 1080p clip.

    python bench/media.py              # 200 rounds of the small clip, 5 of the 1080p one
    python bench/media.py --rounds 50

CPU is the process's own (user + system, every thread), so an encoder's worker threads are counted. The same
thumbnail and preview of the 1080p clip are made by the `ffmpeg` command line beside ours, and the ratio
printed: the one on PATH, `--ffmpeg PATH`, or the one the `imageio-ffmpeg` wheel carries (the `bench` extra).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vidjobs.fakeprovider.clips import ClipSpec, encode  # noqa: E402
from vidjobs.media.pipeline import PreviewSpec, derive  # noqa: E402


def big_clip(path: Path, *, seconds: float = 10, width: int = 1920, height: int = 1080, fps: int = 24) -> None:
    """A 1080p H.264 clip with motion (a gradient sliding across), as a real provider would return one."""
    import av
    from PIL import Image, ImageChops

    ramp = Image.linear_gradient("L").rotate(90).resize((width, height))
    base = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT), ramp.rotate(180)))
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "23"}
        for i in range(int(seconds * fps)):
            frame = ImageChops.offset(base, i * 8, i * 2)
            out.mux(stream.encode(av.VideoFrame.from_image(frame)))
        out.mux(stream.encode())


def cpu_ms(rounds: int, clip: Path, work: Path) -> list[float]:
    """CPU milliseconds of each `derive` round."""
    spent = []
    for i in range(rounds):
        round_dir = work / f"r{i}"
        round_dir.mkdir()
        started = time.process_time()
        derive(clip, round_dir, PreviewSpec())
        spent.append((time.process_time() - started) * 1000)
        shutil.rmtree(round_dir)
    return spent


def ffmpeg_ms(ffmpeg: str, clip: Path, work: Path, rounds: int) -> list[float]:
    """CPU milliseconds (the child's user + system) of `ffmpeg` making the same thumbnail and preview."""
    import resource

    spent = []
    for i in range(rounds):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([
            ffmpeg, "-loglevel", "error", "-y", "-i", str(clip),
            "-map", "0:v:0", "-ss", "1", "-frames:v", "1", "-vf", "scale=320:-2", str(work / f"t{i}.jpg"),
            "-map", "0:v:0", "-t", "3", "-an", "-vf", "fps=12,scale=320:-2", "-c:v", "libx264",
            "-preset", "veryfast", "-crf", "30", "-movflags", "+faststart", str(work / f"p{i}.mp4"),
        ], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000)
    return spent


def _ffmpeg() -> str | None:
    if found := shutil.which("ffmpeg"):
        return found
    try:
        import imageio_ffmpeg
    except ImportError:
        return None
    return imageio_ffmpeg.get_ffmpeg_exe()


def show(name: str, values: list[float]) -> float:
    median = statistics.median(values)
    print(f"{name:<34} median {median:8.1f} ms  mean {statistics.fmean(values):8.1f} ms  "
          f"min {min(values):8.1f} ms  (n={len(values)})")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the small clip (default 200)")
    parser.add_argument("--big-rounds", type=int, default=5, help="rounds of the 1080p clip (default 5)")
    parser.add_argument("--ffmpeg", default=_ffmpeg(), help="an ffmpeg binary to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-media-") as tmp:
        work = Path(tmp)
        small = work / "small.mp4"
        small.write_bytes(encode(ClipSpec(width=320, height=180, duration_s=1, seed=7)))
        big = work / "big.mp4"
        big_clip(big)
        for name in ("warm", "small", "bigw"):
            (work / name).mkdir()
        cpu_ms(3, small, work / "warm")  # codecs loaded, caches warm
        show("derive, 1 s 320x180 (benchmark clip)", cpu_ms(args.rounds, small, work / "small"))
        ours = show("derive, 10 s 1080p", cpu_ms(args.big_rounds, big, work / "bigw"))
        if args.ffmpeg:
            theirs = show("ffmpeg CLI, 10 s 1080p thumb+preview", ffmpeg_ms(args.ffmpeg, big, work, args.big_rounds))
            print(f"ours / ffmpeg (10 s 1080p, thumbnail + preview; ours also verifies): {ours / theirs:.2f}")
        else:
            print("(no ffmpeg: install the bench extra, or pass --ffmpeg, to compare)")


if __name__ == "__main__":
    main()
