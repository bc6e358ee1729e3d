"""Decoding and cleaning an uploaded image: PNG, JPEG or WebP only, within the pixel limits, metadata stripped.

Runs in the media worker, never in the API process. The header is read again first (imageheaders): the
declared size must pass the limits before any decoder runs. Only then is the image decoded (in a thread, a
few at a time), turned upright by its EXIF orientation, and re-encoded from its pixels alone: no EXIF (so no
GPS position), no XMP, no comments or text chunks reach storage or a provider.
"""

from __future__ import annotations

import hashlib
import io
import struct
import warnings

import msgspec
from PIL import Image, ImageOps

from vidjobs.common.imageheaders import ImageKind, ImageRefused, Limits, Refusal, check_limits, read_header, too_large


class CleanImage(msgspec.Struct, frozen=True):
    data: bytes  # the re-encoded image, pixels only
    sha256: str  # of `data`
    kind: ImageKind
    width: int  # upright, after EXIF orientation
    height: int


# Only what the pixels need to look the same: a palette image's transparent index, nothing else.
_KEEP_INFO = ("transparency",)
_SAVE_OPTIONS = {"PNG": {"compress_level": 6}, "JPEG": {"quality": 92}, "WEBP": {"quality": 90, "method": 4}}
_SAVE_MODES = {"JPEG": ("L", "RGB", "CMYK"), "WEBP": ("RGB", "RGBA")}

# What Pillow raises for data it cannot decode: truncated or corrupt.
_UNREADABLE = (OSError, SyntaxError, ValueError, EOFError, struct.error)
# Pillow's words for a chunk that inflates past its own bounds (a zTXt or iCCP bomb): a bomb, not corruption.
_INFLATES = ("Decompressed data too large", "Too much memory used in text chunks")


def clean(data: bytes, limits: Limits) -> CleanImage:
    """Check, decode, turn upright and re-encode the pixels alone; raises ImageRefused. Blocking: run it in a
    thread."""
    kind = read_header(data, limits).kind
    try:
        with warnings.catch_warnings():
            # Past half of Pillow's own limit it only warns; our limits are lower and already checked.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return _decoded(data, kind, limits)
    except Image.DecompressionBombError as exc:
        raise too_large(limits, "the image is too large to decode") from exc
    except _UNREADABLE as exc:
        if isinstance(exc, ValueError) and any(words in str(exc) for words in _INFLATES):
            raise ImageRefused(Refusal.TOO_LARGE, f"the {kind.name} file holds a compressed chunk that inflates "
                                                  "past what we decode (a decompression bomb)") from exc
        raise ImageRefused(Refusal.CORRUPT,
                           f"the {kind.name} image is truncated or corrupt and cannot be decoded") from exc


def _decoded(data: bytes, kind: ImageKind, limits: Limits) -> CleanImage:
    with Image.open(io.BytesIO(data), formats=[kind.pillow]) as image:
        check_limits(*image.size, limits)  # Pillow's own reading of the header must agree too
        image.load()
        ImageOps.exif_transpose(image, in_place=True)
        encoded = _encode(image, kind)
        return CleanImage(data=encoded, sha256=hashlib.sha256(encoded).hexdigest(), kind=kind,
                          width=image.width, height=image.height)


def _encode(image: Image.Image, kind: ImageKind) -> bytes:
    image.info = {k: v for k, v in image.info.items() if k in _KEEP_INFO}
    allowed = _SAVE_MODES.get(kind.pillow)
    if allowed is not None and image.mode not in allowed:
        image = image.convert("RGBA" if "A" in image.getbands() and "RGBA" in allowed else "RGB")
    out = io.BytesIO()
    image.save(out, format=kind.pillow, **_SAVE_OPTIONS[kind.pillow])
    return out.getvalue()
