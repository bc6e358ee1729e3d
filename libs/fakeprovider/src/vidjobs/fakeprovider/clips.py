"""The fake provider's clips: real, small H.264 MP4s, drawn from the request so each clip looks its own.

The picture is a two-colour gradient chosen by the seed, a ball bouncing across it on a seed-chosen path and
a bar along the bottom that fills as the clip plays, so clips and frames can be told apart by eye. Clips are
tiny (longest side 320 px, 12 fps) and encoded with x264's fastest preset: a 5 s clip takes tens of
milliseconds. Encoding runs in a worker thread and the result is cached, so the event loop never stalls and
the same clip is never encoded twice while it is remembered.
"""

from __future__ import annotations

import asyncio
import io
import random
from collections import OrderedDict
from collections.abc import Iterator

import av
import msgspec
from PIL import Image, ImageChops, ImageDraw

FPS = 12
LONG_SIDE = 320
ASPECTS: dict[str, tuple[int, int]] = {"16:9": (16, 9), "9:16": (9, 16), "1:1": (1, 1)}
_CACHE_SIZE = 32  # a 5 s clip is ~30 KB; this bounds a long-running provider's memory

_cache: OrderedDict[ClipSpec, bytes] = OrderedDict()

RGB = tuple[int, int, int]


class ClipSpec(msgspec.Struct, frozen=True):
    width: int
    height: int
    duration_s: float
    seed: int
    tint: RGB | None = None  # an input image's mean colour: the gradient starts from it

    @property
    def frame_count(self) -> int:
        return max(1, round(self.duration_s * FPS))


def clip_size(aspect_ratio: str) -> tuple[int, int]:
    """Width and height for an aspect ratio, longest side LONG_SIDE, both even (yuv420p needs that)."""
    w, h = ASPECTS[aspect_ratio]
    scale = LONG_SIDE / max(w, h)
    return _even(w * scale), _even(h * scale)


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
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "28"}
        for image in frames(spec):
            # PyAV's stub leaves from_image's parameter and result untyped (it takes a PIL image, gives a frame).
            frame: av.VideoFrame = av.VideoFrame.from_image(image)  # type: ignore[no-untyped-call]
            container.mux(stream.encode(frame))
        container.mux(stream.encode())  # flush the encoder's delayed frames
    return buf.getvalue()


def frames(spec: ClipSpec) -> Iterator[Image.Image]:
    rng = random.Random(spec.seed)
    w, h, n = spec.width, spec.height, spec.frame_count
    start, end = _colour(rng), _colour(rng)
    background = _gradient(w, h, spec.tint or start, end)
    ball, radius = _colour(rng), max(4, min(w, h) // 8)
    x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
    vx, vy = rng.uniform(2, 8) * rng.choice((-1, 1)), rng.uniform(2, 8) * rng.choice((-1, 1))
    for i in range(n):
        image = background.copy()
        draw = ImageDraw.Draw(image)
        x, y = _bounce(x0 + vx * i, radius, w - radius), _bounce(y0 + vy * i, radius, h - radius)
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=ball)
        draw.rectangle((0, h - 4, round(w * (i + 1) / n), h), fill=(255, 255, 255))
        yield image


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
