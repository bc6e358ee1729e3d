"""Image files for the upload tests, built in memory: ordinary images carrying metadata that must not survive,
and hostile ones (decompression bombs, lies about their type, truncations) built byte by byte."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image, PngImagePlugin

ORIENTATION, MAKE, GPS_IFD = 0x0112, 0x010F, 0x8825
SECRET = "Secret Camera Co"


def exif_with_gps(orientation: int = 1) -> bytes:
    """EXIF naming a camera and a place (Berlin), with the given orientation."""
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    exif[MAKE] = SECRET
    exif[GPS_IFD] = {1: "N", 2: (52.0, 31.0, 12.0), 3: "E", 4: (13.0, 24.0, 3.0)}
    return exif.tobytes()


def halves(size: tuple[int, int], left: tuple[int, ...], right: tuple[int, ...], mode: str = "RGB") -> Image.Image:
    """Left half one colour, right half another: shows which way an image was turned."""
    image = Image.new(mode, size, left)
    image.paste(Image.new(mode, (size[0] // 2, size[1]), right), (size[0] - size[0] // 2, 0))
    return image


def jpeg_with_gps(size: tuple[int, int] = (40, 20), orientation: int = 6) -> bytes:
    out = io.BytesIO()
    halves(size, (220, 40, 40), (40, 40, 220)).save(out, "JPEG", quality=95, exif=exif_with_gps(orientation),
                                                     comment=b"shot at home")
    return out.getvalue()


def png_with_text(size: tuple[int, int] = (30, 10)) -> bytes:
    info = PngImagePlugin.PngInfo()
    info.add_text("Author", SECRET)
    info.add_itxt("XML:com.adobe.xmp", f"<x:xmpmeta>{SECRET}</x:xmpmeta>")
    out = io.BytesIO()
    halves(size, (0, 200, 0, 255), (0, 0, 0, 0), "RGBA").save(out, "PNG", pnginfo=info, exif=exif_with_gps())
    return out.getvalue()


def webp_with_xmp(size: tuple[int, int] = (33, 17)) -> bytes:
    out = io.BytesIO()
    halves(size, (0, 0, 255), (255, 255, 0)).save(out, "WEBP", quality=90, exif=exif_with_gps(),
                                                  xmp=f"<x:xmpmeta>{SECRET}</x:xmpmeta>".encode())
    return out.getvalue()


def noise_png(side: int = 256) -> bytes:
    out = io.BytesIO()
    Image.effect_noise((side, side), 60).convert("RGB").save(out, "PNG")
    return out.getvalue()


# --- hostile files ---------------------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A valid-looking RGB PNG declaring `width` x `height`, with a megabyte of zeros compressed to ~1 KB as
    the start of its pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
            + _png_chunk(b"IDAT", zlib.compress(bytes(1 << 20), 9)) + _png_chunk(b"IEND", b""))


def jpeg_bomb(width: int = 65_500, height: int = 65_500) -> bytes:
    """A real 16 x 16 JPEG whose frame header (SOF0) is rewritten to declare `width` x `height`."""
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (9, 9, 9)).save(out, "JPEG")
    data = bytearray(out.getvalue())
    i = 2
    while data[i + 1] != 0xC0:
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    data[i + 5 : i + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def webp_bomb(width: int = 60_000, height: int = 60_000) -> bytes:
    """An extended WebP (VP8X) whose canvas is `width` x `height`, holding one 8 x 8 lossless image."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (9, 9, 9)).save(out, "WEBP", lossless=True)
    frame = out.getvalue()[12:]  # the VP8L chunk, after RIFF size WEBP
    vp8x = (b"VP8X" + struct.pack("<I", 10) + bytes(4)
            + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little"))
    body = b"WEBP" + vp8x + frame
    return b"RIFF" + struct.pack("<I", len(body)) + body


def text_chunk_bomb(inflated: int = 64 << 20) -> bytes:
    """An ordinary 8 x 8 PNG whose header passes every check, carrying a compressed text chunk (zTXt) that
    inflates to `inflated` bytes of zeros: the bomb is found only by decoding the file."""
    plain = noise_png(8)
    ztxt = _png_chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(bytes(inflated), 9))
    # After IHDR (8 + 25 bytes): before the pixel data, where a decoder reads it on opening the file.
    return plain[:33] + ztxt + plain[33:]


def gif() -> bytes:
    out = io.BytesIO()
    Image.new("P", (8, 8)).save(out, "GIF")
    return out.getvalue()


HTML = b"<!doctype html><html><body><script>alert(1)</script></body></html>\n"
SVG = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>'


def truncated_png() -> bytes:
    data = noise_png()
    return data[: len(data) // 2]


def decoded_bytes(width: int, height: int, channels: int = 3) -> int:
    return width * height * channels
