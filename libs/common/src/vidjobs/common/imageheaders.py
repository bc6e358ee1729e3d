"""What an uploaded image's first bytes say, read without a decoder: its format and its declared size.

The gateway reads only this before it stores an upload (a wrong format or a header that declares more pixels
than allowed is refused at once, at no cost); the media worker reads it again before it decodes anything.
The client's Content-Type is never trusted: the bytes decide. The width and height come from the header
itself, because a 100 000 x 100 000 PNG is a few kilobytes on the wire and 40 GB once decoded, so only the
header may be believed until it passes; and because Pillow's WebP opener allocates the whole canvas when it
opens a file. Nothing here imports an image library.
"""

from __future__ import annotations

import enum
import struct
from typing import Literal

import msgspec

ImageType = Literal["image/png", "image/jpeg", "image/webp"]  # the images an upload may be


class ImageKind(msgspec.Struct, frozen=True):
    name: str  # as a person says it
    content_type: ImageType
    extension: str  # of the stored object
    pillow: str  # Pillow's format name: the only decoder allowed to open it


PNG = ImageKind("PNG", "image/png", "png", "PNG")
JPEG = ImageKind("JPEG", "image/jpeg", "jpg", "JPEG")
WEBP = ImageKind("WebP", "image/webp", "webp", "WEBP")
KINDS = {kind.content_type: kind for kind in (PNG, JPEG, WEBP)}
ACCEPTED = "PNG, JPEG or WebP (image/png, image/jpeg, image/webp)"

# Formats we recognise only to name them in the refusal.
_REFUSED_MAGIC = [
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
    (b"%PDF", "PDF"), (b"\x00\x00\x01\x00", "ICO"), (b"<", "markup (SVG, HTML or XML)"),
    (b"\xef\xbb\xbf<", "markup (SVG, HTML or XML)"),
]


class Refusal(enum.StrEnum):
    """Why an image is refused; the gateway answers 415 for UNSUPPORTED and 422 for the others, the media
    worker records the value as the upload's rejection reason."""

    UNSUPPORTED = "image_unsupported"  # not a format we accept
    CORRUPT = "image_corrupt"  # truncated, corrupt, or cannot be decoded
    TOO_LARGE = "image_too_large"  # more pixels than the limits allow, declared or found while decoding
    EMPTY = "image_empty"  # no bytes at all


class ImageRefused(Exception):
    def __init__(self, reason: Refusal, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class Limits(msgspec.Struct, frozen=True):
    max_side: int  # pixels, either side
    max_pixels: int  # width x height


def unsupported(what: str) -> ImageRefused:
    return ImageRefused(Refusal.UNSUPPORTED, f"the body is {what}; send a {ACCEPTED} image")


def sniff(data: bytes) -> ImageKind:
    """The format the bytes themselves say they are."""
    if not data:
        raise ImageRefused(Refusal.EMPTY, "the body is empty; send the image's bytes as the body")
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


def declared_size(data: bytes, kind: ImageKind) -> tuple[int, int]:
    """Width and height as the header states them, before anything is decoded."""
    reader = {"PNG": _png_size, "JPEG": _jpeg_size, "WEBP": _webp_size}[kind.pillow]
    try:
        size = reader(data)
    except (struct.error, IndexError):
        size = None
    if size is None or min(size) <= 0:
        raise ImageRefused(Refusal.CORRUPT, f"the {kind.name} header is truncated or corrupt: it does not say "
                                            "how large the image is")
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


def too_large(limits: Limits, what: str) -> ImageRefused:
    return ImageRefused(Refusal.TOO_LARGE, f"{what}; the limits are {limits.max_side} pixels on either side and "
                                           f"{limits.max_pixels} pixels in all")


def check_limits(width: int, height: int, limits: Limits) -> None:
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise too_large(limits, f"the image declares {width} x {height} pixels")


class Header(msgspec.Struct, frozen=True):
    kind: ImageKind
    width: int  # as declared, before any EXIF orientation is applied
    height: int


def read_header(data: bytes, limits: Limits) -> Header:
    """The format and declared size of `data`, within `limits`; raises ImageRefused. Cheap: reads a few
    dozen bytes, decodes nothing."""
    kind = sniff(data)
    width, height = declared_size(data, kind)
    check_limits(width, height, limits)
    return Header(kind=kind, width=width, height=height)
