"""The thumbnail: one decoded frame, scaled down and saved as a JPEG. Blocking; run it in a thread."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import msgspec
from PIL import Image

MAX_SIDE = 320  # enough for a job list or a poster; a few KB
QUALITY = 82


class Thumbnail(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    width: int
    height: int
    bytes: int
    sha256: str


def thumbnail_size(width: int, height: int, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """The size `Image.thumbnail((max_side, max_side))` gives a width x height picture (never enlarged; each
    side rounded to whichever of floor and ceiling keeps the aspect ratio closer), so a frame scaled to it
    before it is a PIL image is not scaled again."""
    if width <= max_side and height <= max_side:
        return width, height
    aspect = width / height
    if aspect >= 1:
        side = height * max_side / width
        short = min(math.floor(side), math.ceil(side), key=lambda n: abs(aspect - max_side / n) if n else math.inf)
        return max_side, max(short, 1)
    side = width * max_side / height
    short = min(math.floor(side), math.ceil(side), key=lambda n: abs(aspect - n / max_side))
    return max(short, 1), max_side


def write_thumbnail(image: Image.Image, dest: Path, *, max_side: int = MAX_SIDE) -> Thumbnail:
    thumb = image.convert("RGB")  # JPEG has no alpha or palette; also leaves the caller's image untouched
    thumb.thumbnail((max_side, max_side))  # keeps the aspect ratio and never enlarges
    thumb.save(dest, "JPEG", quality=QUALITY, optimize=True)
    data = dest.read_bytes()
    return Thumbnail(path=dest, width=thumb.width, height=thumb.height, bytes=len(data),
                     sha256=hashlib.sha256(data).hexdigest())
