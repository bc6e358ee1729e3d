"""The fake provider's clips: real H.264 MP4s, drawn from the request so each clip looks its own.

The picture is a two-colour gradient chosen by the seed, a ball bouncing across it on a seed-chosen path and
a bar along the bottom that fills as the clip plays, so clips and frames can be told apart by eye.

Two kinds (ClipKind). Tiny clips (longest side 320 px, 12 fps, x264's fastest preset) take tens of
milliseconds for 5 s and are kept in memory: the test suite's default. Real clips are what providers
deliver: the requested resolution (480p, 720p, 1080p on the short side), 24 fps, High profile at a
realistic bitrate, with film grain over the picture so the encoder has to spend those bits and a decoder
works as hard as on a real render. A 10 s 1080p clip takes seconds to encode, so real clips are made once
per distinct request and kept on disk (clip_cache.py). Encoding runs in a worker thread, so the event loop
never stalls.
"""

from __future__ import annotations

import asyncio
import enum
import io
import random
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import av
import msgspec
from PIL import Image, ImageChops, ImageDraw

FPS = 12
LONG_SIDE = 320
ASPECTS: dict[str, tuple[int, int]] = {"16:9": (16, 9), "9:16": (9, 16), "1:1": (1, 1)}
REAL_FPS = 24
# The short side of each resolution, and the average bitrate a provider's H.264 of it has (kbit/s): about
# what streaming services encode 24 fps at, so a 10 s 1080p clip is ~10 MB, an 8 s 720p one ~5 MB.
RESOLUTIONS: dict[str, int] = {"480p": 480, "720p": 720, "1080p": 1080}
BITRATE_KBPS: dict[int, int] = {480: 2500, 720: 5000, 1080: 8000}
GRAIN_TILES = 5  # distinct grain patterns cycled through; more than x264's reference frames reach back
GRAIN_SIGMA = 6.0  # grain's standard deviation, in 8-bit levels: visible on a close look, like sensor noise
_CACHE_SIZE = 32  # a 5 s clip is ~30 KB; this bounds a long-running provider's memory

_cache: OrderedDict[ClipSpec, bytes] = OrderedDict()

RGB = tuple[int, int, int]


class ClipKind(enum.StrEnum):
    TINY = "tiny"  # 320 px, 12 fps, in memory: fast tests
    REAL = "real"  # the requested resolution, 24 fps, a realistic bitrate, on disk: production-sized media


class ClipSpec(msgspec.Struct, frozen=True):
    width: int
    height: int
    duration_s: float
    seed: int
    tint: RGB | None = None  # an input image's mean colour: the gradient starts from it
    fps: int = FPS
    bitrate_kbps: int = 0  # 0: a tiny clip (constant quality, fastest preset); else a real clip at this rate

    @property
    def frame_count(self) -> int:
        return max(1, round(self.duration_s * self.fps))

    @property
    def real(self) -> bool:
        return self.bitrate_kbps > 0


def clip_size(aspect_ratio: str) -> tuple[int, int]:
    """Width and height for an aspect ratio, longest side LONG_SIDE, both even (yuv420p needs that)."""
    w, h = ASPECTS[aspect_ratio]
    scale = LONG_SIDE / max(w, h)
    return _even(w * scale), _even(h * scale)


def real_spec(aspect_ratio: str, resolution: str, duration_s: float, seed: int) -> ClipSpec:
    """A real clip: `resolution` on the short side (1920×1080 for 16:9 1080p), 24 fps, its bitrate."""
    short = RESOLUTIONS[resolution]
    w, h = ASPECTS[aspect_ratio]
    scale = short / min(w, h)
    return ClipSpec(_even(w * scale), _even(h * scale), float(duration_s), seed, fps=REAL_FPS,
                    bitrate_kbps=BITRATE_KBPS[short])


def _even(x: float) -> int:
    return max(2, round(x / 2) * 2)


async def render_mp4(spec: ClipSpec) -> bytes:
    """The clip's MP4 bytes, encoded off the event loop the first time they are asked for."""
    cached = _cache.get(spec)
    if cached is not None:
        _cache.move_to_end(spec)
        return cached
    data = await asyncio.to_thread(encode, spec)
    _cache[spec] = data
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return data


def encode(spec: ClipSpec) -> bytes:
    buf = io.BytesIO()
    encode_into(spec, buf)
    return buf.getvalue()


def encode_into(spec: ClipSpec, target: BinaryIO | Path) -> None:
    """Encode the clip into a file object or a file. Blocking: seconds for a real 1080p clip."""
    with av.open(str(target) if isinstance(target, Path) else target, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=spec.fps)
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        if spec.real:
            # What a provider's pipeline produces: High profile, CABAC, B-frames, an average bitrate held by
            # rate control with a VBV cap (x264's defaults otherwise: one keyframe per 250 frames or cut).
            # x264's trellis B-frame decision gives this grainy picture the B-frames a provider's grain-free
            # renders get from any preset; with the fast decision it encodes the grain as P-frames only.
            stream.bit_rate = spec.bitrate_kbps * 1000
            stream.options = {"preset": "superfast", "profile": "high", "maxrate": f"{spec.bitrate_kbps * 3 // 2}k",
                              "bufsize": f"{spec.bitrate_kbps * 2}k", "x264-params": "b-adapt=2"}
        else:
            stream.options = {"preset": "ultrafast", "crf": "28"}
        for image in frames(spec):
            # PyAV's stub leaves from_image's parameter and result untyped (it takes a PIL image, gives a frame).
            frame: av.VideoFrame = av.VideoFrame.from_image(image)  # type: ignore[no-untyped-call]
            container.mux(stream.encode(frame))
        container.mux(stream.encode())  # flush the encoder's delayed frames


def frames(spec: ClipSpec) -> Iterator[Image.Image]:
    rng = random.Random(spec.seed)
    w, h, n = spec.width, spec.height, spec.frame_count
    start, end = _colour(rng), _colour(rng)
    background = _gradient(w, h, spec.tint or start, end)
    ball, radius = _colour(rng), max(4, min(w, h) // 8)
    x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
    speed = min(w, h) / 180 if spec.real else 1.0  # a real clip's ball crosses its frame as fast as a tiny one
    vx, vy = rng.uniform(2, 8) * speed * rng.choice((-1, 1)), rng.uniform(2, 8) * speed * rng.choice((-1, 1))
    grain = _grain(w, h) if spec.real else []
    bar = h // 45 if spec.real else 4
    for i in range(n):
        image = background.copy()
        draw = ImageDraw.Draw(image)
        x, y = _bounce(x0 + vx * i, radius, w - radius), _bounce(y0 + vy * i, radius, h - radius)
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=ball)
        draw.rectangle((0, h - bar, round(w * (i + 1) / n), h), fill=(255, 255, 255))
        yield ImageChops.add(image, grain[i % len(grain)], offset=-128) if grain else image


def _grain(w: int, h: int) -> list[Image.Image]:
    """Noise images centred on 128, added to each frame (less 128): a fresh pattern every frame as far as
    the encoder can tell, since it cannot reference back GRAIN_TILES frames."""
    tiles = []
    for _ in range(GRAIN_TILES):
        luma = Image.effect_noise((w, h), GRAIN_SIGMA)
        tiles.append(Image.merge("RGB", (luma, luma, luma)))
    return tiles


def _colour(rng: random.Random) -> RGB:
    return rng.randrange(256), rng.randrange(256), rng.randrange(256)


def _gradient(w: int, h: int, start: RGB, end: RGB) -> Image.Image:
    down = Image.linear_gradient("L")
    mask = ImageChops.add(down, down.rotate(90), scale=2).resize((w, h))  # diagonal, corner to corner
    return Image.composite(Image.new("RGB", (w, h), end), Image.new("RGB", (w, h), start), mask)


def _bounce(pos: float, lo: float, hi: float) -> float:
    """`pos` folded back and forth into [lo, hi], like a ball bouncing off two walls."""
    span = hi - lo
    if span <= 0:
        return lo
    p = (pos - lo) % (2 * span)
    return lo + (p if p <= span else 2 * span - p)
