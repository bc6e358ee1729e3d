"""CPU the media service spends deriving a render's assets: verify, thumbnail and preview (`derive`), on the
lifecycle benchmark's clip (1 s, 320x180, as the fake provider renders it) and on clips the size providers
deliver: 720p and 1080p, 5 and 10 s, 24 fps, of two kinds:

- provider: the fake provider's real clips (H.264 High profile with CABAC and B-frames at a provider's
  bitrate, film grain over the picture), which decode as hard as a provider's render;
- flat: a gradient sliding across, x264 `ultrafast` (Constrained Baseline, no B-frames), which decodes
  ten times cheaper and so shows what is spent above the decoding.

For each real-size clip, every round prints three figures:

- ours: `derive` (it also reads the whole track to verify it);
- ffmpeg CLI: the `ffmpeg` command line making the same thumbnail and preview (same scale, x264 preset and
  CRF; ffmpeg's default threads): the one on PATH, `--ffmpeg PATH`, or the `imageio-ffmpeg` wheel's (the
  `bench` group);
- floor: decoding, with the same library on one thread, only the frames the outputs need (from the start
  to the preview's end, less the frames nothing references that neither output takes), and nothing else:
  no scaling, no encoding, no JPEG.

    python bench/media.py                          # 200 rounds of the small clip, 5 of each real-size clip
    python bench/media.py --rounds 50 --big-rounds 3 --sizes 1080p:10,720p:5 --kind provider --clips /tmp/clips

CPU is the process's own (user + system, every thread), so an encoder's worker threads are counted; the
`ffmpeg` figure is its child's. `--clips DIR` keeps the generated clips there and reuses them next run.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import av  # noqa: E402

from vidjobs.fakeprovider.clips import ClipSpec, encode, encode_into, real_spec  # noqa: E402
from vidjobs.media.pipeline import PreviewSpec, derive  # noqa: E402
from vidjobs.media.preview import PreviewWriter  # noqa: E402
from vidjobs.media.verify import PosterPicker, TrackReader, duration_of  # noqa: E402

SIZES = {"720p": (1280, 720), "1080p": (1920, 1080)}
DEFAULT_SIZES = "720p:5,720p:10,1080p:5,1080p:10"
KINDS = ("provider", "flat")
POSTER_AT_S = 1.0
THUMB_SIDE = 320


def big_clip(path: Path, *, seconds: float = 10, width: int = 1920, height: int = 1080, fps: int = 24) -> None:
    """An H.264 clip with motion (a gradient sliding across), as a real provider would return one."""
    from PIL import Image, ImageChops

    ramp = Image.linear_gradient("L").rotate(90).resize((width, height))
    base = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT), ramp.rotate(180)))
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "23"}
        for i in range(int(seconds * fps)):
            frame = ImageChops.offset(base, i * 8 * width // 1920, i * 2 * height // 1080)
            out.mux(stream.encode(av.VideoFrame.from_image(frame)))
        out.mux(stream.encode())


def ours_ms(clip: Path, work: Path) -> float:
    """CPU milliseconds of one `derive`."""
    work.mkdir()
    started = time.process_time()
    derive(clip, work, PreviewSpec())
    spent = (time.process_time() - started) * 1000
    shutil.rmtree(work)
    return spent


def floor_ms(clip: Path, work: Path) -> float:
    """CPU milliseconds of decoding only the frames the outputs need: from the start to the preview's end
    (the poster lies within it), one thread, as `derive` decodes, less the frames nothing references that
    neither output takes; nothing done with the frames."""
    spec = PreviewSpec()
    started = time.process_time()
    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        preview = PreviewWriter(work / "unused.mp4", seconds=spec.seconds, max_side=spec.max_side)
        poster = PosterPicker(duration_of(container, stream))
        track = TrackReader(container, stream)
        for frame in track.frames(lambda at, lasts: preview.needs(at, lasts) or poster.needs(at, lasts)):
            poster.offer(frame)
            if (frame.time or 0.0) >= spec.seconds:
                break
    return (time.process_time() - started) * 1000


def ffmpeg_ms(ffmpeg: str, clip: Path, work: Path) -> float:
    """CPU milliseconds (the child's user + system) of `ffmpeg` making the same thumbnail and preview."""
    spec = PreviewSpec()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([
        ffmpeg, "-loglevel", "error", "-y", "-i", str(clip),
        "-map", "0:v:0", "-ss", str(POSTER_AT_S), "-frames:v", "1", "-vf", f"scale={THUMB_SIDE}:-2",
        str(work / "t.jpg"),
        "-map", "0:v:0", "-t", str(spec.seconds), "-an", "-vf", f"fps=12,scale={spec.max_side}:-2",
        "-c:v", "libx264", "-preset", "ultrafast", "-crf", "30", "-movflags", "+faststart", str(work / "p.mp4"),
    ], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000


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


def clip_for(kind: str, size: str, seconds: int, clips: Path) -> Path:
    path = clips / f"{kind}-{size}-{seconds}s.mp4"
    if not path.exists():
        print(f"encoding the {kind} {seconds} s {size} clip ...", file=sys.stderr, flush=True)
        width, height = SIZES[size]
        partial = path.with_suffix(".part.mp4")
        if kind == "flat":
            big_clip(partial, seconds=seconds, width=width, height=height)
        else:
            encode_into(real_spec("16:9", size, seconds, seed=7), partial)
        partial.rename(path)
    return path


def real_size(name: str, clip: Path, work: Path, rounds: int, ffmpeg: str | None) -> None:
    tag = name.replace(" ", "-")
    ours, theirs, floor = [], [], []
    for i in range(rounds):
        ours.append(ours_ms(clip, work / f"{tag}-{i}"))
        floor.append(floor_ms(clip, work))
        line = f"round {i + 1} {name}: ours {ours[-1]:6.1f} ms  floor {floor[-1]:6.1f} ms"
        if ffmpeg:
            theirs.append(ffmpeg_ms(ffmpeg, clip, work))
            line += f"  ffmpeg CLI {theirs[-1]:6.1f} ms  ours/ffmpeg {ours[-1] / theirs[-1]:.2f}"
        print(f"{line}  ours/floor {ours[-1] / floor[-1]:.2f}", flush=True)
    mine = show(f"derive, {name}", ours)
    least = show(f"floor, {name}", floor)
    summary = f"{name}: ours/floor {mine / least:.2f}"
    if theirs:
        summary += f"  ours/ffmpeg {mine / show(f'ffmpeg CLI, {name}', theirs):.2f}"
    print(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the small clip (default 200)")
    parser.add_argument("--big-rounds", type=int, default=5, help="rounds of each real-size clip (default 5)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"real-size clips, SIZE:SECONDS,... "
                        f"(default {DEFAULT_SIZES})")
    parser.add_argument("--kind", default=",".join(KINDS), help=f"clip kinds, KIND,... of {', '.join(KINDS)} "
                        f"(default both)")
    parser.add_argument("--clips", type=Path, help="a folder to keep the generated clips in and reuse")
    parser.add_argument("--ffmpeg", default=_ffmpeg(), help="an ffmpeg binary to compare with")
    args = parser.parse_args()
    sizes = [(size, int(seconds)) for size, seconds in (item.split(":") for item in args.sizes.split(","))]
    kinds = args.kind.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown clip kind {', '.join(sorted(unknown))}: use {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory(prefix="vidjobs-bench-media-") as tmp:
        work = Path(tmp)
        clips = args.clips or work
        clips.mkdir(parents=True, exist_ok=True)
        small = work / "small.mp4"
        small.write_bytes(encode(ClipSpec(width=320, height=180, duration_s=1, seed=7)))
        for i in range(3):  # codecs loaded, caches warm
            ours_ms(small, work / f"warm{i}")
        show("derive, 1 s 320x180 (benchmark clip)",
             [ours_ms(small, work / f"small{i}") for i in range(args.rounds)])
        if not args.ffmpeg:
            print("(no ffmpeg: install the bench group, or pass --ffmpeg, to compare)")
        for kind in kinds:
            for size, seconds in sizes:
                real_size(f"{seconds} s {size} {kind}", clip_for(kind, size, seconds, clips), work,
                          args.big_rounds, args.ffmpeg)


if __name__ == "__main__":
    main()
