"""Checking and cleaning an uploaded image: PNG, JPEG or WebP only, within size limits, metadata stripped.

The order matters. The format is sniffed from the first bytes (the client's Content-Type is never trusted),
then the width and height the header declares are checked against the limits before any decoder runs: a
100 000 x 100 000 PNG is a few kilobytes on the wire and 40 GB once decoded, so only the header may be
believed until it passes. We read the header ourselves because Pillow's WebP opener allocates the whole
canvas when it opens a file. Only then is the image decoded (in a thread, a few at a time, so uploads never
stall the API), turned upright by its EXIF orientation, and re-encoded from its pixels alone: no EXIF (so no
GPS position), no XMP, no comments or text chunks reach storage or a provider.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import struct

import msgspec
from PIL import Image, ImageOps

from vidjobs.common.errors import ErrorCode
from vidjobs.gateway.apierrors import ApiError, GatewayCode
from vidjobs.gateway.bodies import ImageType

# Image decodes in flight at once per gateway process; each may hold a few hundred MB at the pixel limit.
DECODE_SLOTS = 2


class ImageKind(msgspec.Struct, frozen=True):
    name: str  # as a person says it
    content_type: ImageType
    extension: str  # of the stored object
    pillow: str  # Pillow's format name: the only decoder allowed to open it


PNG = ImageKind("PNG", "image/png", "png", "PNG")
JPEG = ImageKind("JPEG", "image/jpeg", "jpg", "JPEG")
WEBP = ImageKind("WebP", "image/webp", "webp", "WEBP")
ACCEPTED = "PNG, JPEG or WebP (image/png, image/jpeg, image/webp)"

# Formats we recognise only to name them in the refusal.
_REFUSED_MAGIC = [
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
    (b"%PDF", "PDF"), (b"\x00\x00\x01\x00", "ICO"), (b"<", "markup (SVG, HTML or XML)"),
    (b"\xef\xbb\xbf<", "markup (SVG, HTML or XML)"),
]


class Limits(msgspec.Struct, frozen=True):
    max_side: int  # pixels, either side
    max_pixels: int  # width x height


class CleanImage(msgspec.Struct, frozen=True):
    data: bytes  # the re-encoded image, pixels only
    sha256: str  # of `data`
    kind: ImageKind
    width: int  # upright, after EXIF orientation
    height: int


def unsupported(what: str) -> ApiError:
    return ApiError(415, GatewayCode.UNSUPPORTED_MEDIA_TYPE, f"the body is {what}; send a {ACCEPTED} image")


def invalid(message: str) -> ApiError:
    return ApiError(422, ErrorCode.INVALID_INPUT, message)


def sniff(data: bytes) -> ImageKind:
    """The format the bytes themselves say they are."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    for magic, name in _REFUSED_MAGIC:
        if data.lstrip(b" \t\r\n").startswith(magic):
            raise unsupported(f"a {name} file, which is not accepted")
    raise unsupported("not an image we can read")


# --- the declared size, from the header alone ----------------------------------------------------------


def declared_size(data: bytes, kind: ImageKind) -> tuple[int, int]:
    """Width and height as the header states them, before anything is decoded."""
    reader = {"PNG": _png_size, "JPEG": _jpeg_size, "WEBP": _webp_size}[kind.pillow]
    try:
        size = reader(data)
    except (struct.error, IndexError):
        size = None
    if size is None or min(size) <= 0:
        raise invalid(f"the {kind.name} header is truncated or corrupt: it does not say how large the image is")
    return size


def _png_size(data: bytes) -> tuple[int, int] | None:
    # The first chunk is always IHDR: length, type, then width and height as big-endian 32-bit numbers.
    return struct.unpack(">II", data[16:24]) if data[12:16] == b"IHDR" else None


# Real files reach their frame header within a few dozen segments; the cap keeps a file of nothing but empty
# segments from holding the event loop.
_JPEG_MAX_STEPS = 1000
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the marker segments up to the first frame header (SOFn), which holds height then width."""
    i = 2
    for _ in range(_JPEG_MAX_STEPS):
        if i + 4 > len(data) or data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
        elif marker in (0xD9, 0xDA):  # end of image or start of scan: no frame header came first
            return None
        elif marker in _SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        else:
            i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":  # extended format: the canvas, 24-bit width-1 and height-1
        return (int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy key frame
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and data[20] == 0x2F:  # lossless: 14-bit width-1 and height-1
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def check_limits(width: int, height: int, limits: Limits) -> None:
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise invalid(
            f"the image declares {width} x {height} pixels; the limits are {limits.max_side} pixels on either "
            f"side and {limits.max_pixels} pixels in all")


# --- decoding and re-encoding (in a thread) --------------------------------------------------------------

# Only what the pixels need to look the same: a palette image's transparent index, nothing else.
_KEEP_INFO = ("transparency",)
_SAVE_OPTIONS = {"PNG": {"compress_level": 6}, "JPEG": {"quality": 92}, "WEBP": {"quality": 90, "method": 4}}
_SAVE_MODES = {"JPEG": ("L", "RGB", "CMYK"), "WEBP": ("RGB", "RGBA")}

# What Pillow raises for data it cannot decode: truncated, corrupt, or past its own bomb limit.
_UNREADABLE = (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError)


def clean(data: bytes, kind: ImageKind, limits: Limits) -> CleanImage:
    """Decode, turn upright, and re-encode the pixels alone. Blocking: run it in a thread."""
    try:
        with Image.open(io.BytesIO(data), formats=[kind.pillow]) as image:
            check_limits(*image.size, limits)  # Pillow's own reading of the header must agree too
            image.load()
            ImageOps.exif_transpose(image, in_place=True)
            encoded = _encode(image, kind)
            return CleanImage(data=encoded, sha256=hashlib.sha256(encoded).hexdigest(), kind=kind,
                              width=image.width, height=image.height)
    except Image.DecompressionBombError as exc:
        raise invalid(f"the image is too large to decode; the limits are {limits.max_side} pixels on either "
                      f"side and {limits.max_pixels} pixels in all") from exc
    except _UNREADABLE as exc:
        raise invalid(f"the {kind.name} image is truncated or corrupt and cannot be decoded") from exc


def _encode(image: Image.Image, kind: ImageKind) -> bytes:
    image.info = {k: v for k, v in image.info.items() if k in _KEEP_INFO}
    allowed = _SAVE_MODES.get(kind.pillow)
    if allowed is not None and image.mode not in allowed:
        image = image.convert("RGBA" if "A" in image.getbands() and "RGBA" in allowed else "RGB")
    out = io.BytesIO()
    image.save(out, format=kind.pillow, **_SAVE_OPTIONS[kind.pillow])
    return out.getvalue()


class Cleaner:
    """Checks every upload the same way; the cheap checks run at once, decoding waits for a slot."""

    def __init__(self, limits: Limits, *, slots: int = DECODE_SLOTS):
        self.limits = limits
        self._slots = asyncio.Semaphore(slots)

    async def __call__(self, data: bytes) -> CleanImage:
        if not data:
            raise invalid("the body is empty; send the image's bytes as the body")
        kind = sniff(data)
        check_limits(*declared_size(data, kind), self.limits)
        async with self._slots:
            return await asyncio.to_thread(clean, data, kind, self.limits)
