"""Input images as a real provider takes them: fetched over HTTP when the render starts, bounded in size, and
decoded; one that cannot be fetched or read makes the render's request unusable."""

from __future__ import annotations

import asyncio
import io

import aiohttp
import msgspec
from PIL import Image, ImageStat

from vidjobs.fakeprovider.clips import RGB

MAX_INPUT_IMAGE_BYTES = 20 * 1024 * 1024  # larger input images are refused, as real providers do


class InputImage(msgspec.Struct, frozen=True):
    format: str  # Pillow's name: PNG, JPEG, WEBP, ...
    width: int
    height: int
    mean: RGB


async def take(session: aiohttp.ClientSession, url: str) -> tuple[bytes, InputImage]:
    """The image's bytes and what they decode to; ValueError naming what went wrong otherwise."""
    data = await fetch(session, url)
    return data, await asyncio.to_thread(inspect_image, data)


async def fetch(session: aiohttp.ClientSession, url: str) -> bytes:
    """The image's bytes; ValueError naming what went wrong otherwise."""
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                raise ValueError(f"fetching it answered HTTP {resp.status}")
            data = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > MAX_INPUT_IMAGE_BYTES:
                    raise ValueError(f"it is larger than {MAX_INPUT_IMAGE_BYTES} bytes")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"it could not be fetched ({exc!r})") from exc
    return bytes(data)


def inspect_image(data: bytes) -> InputImage:
    """Decode an input image the way a provider would before animating it; raises ValueError if it is not
    one. Blocking: run it in a thread."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            size, fmt = image.size, image.format or "unknown"
            image.draft("RGB", (64, 64))  # JPEG decodes at a fraction of its size; others ignore it
            small = image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"it cannot be decoded as an image ({exc})") from exc
    small.thumbnail((64, 64))
    mean = tuple(round(c) for c in ImageStat.Stat(small).mean)
    return InputImage(format=fmt, width=size[0], height=size[1], mean=(mean[0], mean[1], mean[2]))
