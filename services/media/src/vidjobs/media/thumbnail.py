"""The thumbnail: one decoded frame, scaled down and saved as a JPEG. Blocking; run it in a thread."""

from __future__ import annotations

import hashlib
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


def write_thumbnail(image: Image.Image, dest: Path, *, max_side: int = MAX_SIDE) -> Thumbnail:
    thumb = image.convert("RGB")  # JPEG has no alpha or palette; also leaves the caller's image untouched
    thumb.thumbnail((max_side, max_side))  # keeps the aspect ratio and never enlarges
    thumb.save(dest, "JPEG", quality=QUALITY, optimize=True)
    data = dest.read_bytes()
    return Thumbnail(path=dest, width=thumb.width, height=thumb.height, bytes=len(data),
                     sha256=hashlib.sha256(data).hexdigest())
