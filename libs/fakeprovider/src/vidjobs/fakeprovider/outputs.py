"""Serving a finished render's clip, as a provider's storage would, or as a slow or stuck one would.

`params.output_mb` pads the clip to that many megabytes with a trailing `free` box (still a valid MP4);
`params.serve_kb_per_s` paces the body at that rate; `params.serve_stall_after_mb` stops sending after that
many megabytes and holds the connection open, sending nothing more, until the client gives up. Everything is
streamed: neither a padded body nor a real clip's file is held in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from aiohttp import web

from vidjobs.fakeprovider.scenarios import ClipData
from vidjobs.fakeprovider.wire import RenderParams

CHUNK = 1 << 20
PACED_CHUNKS_PER_S = 20  # a paced body goes out in this many pieces a second, so its rate is steady
STALL_HOLD_S = 600.0  # a stalled body's connection is held at most this long, so the server can always stop
HOLD_CHECK_S = 0.2
MB = 1_000_000


async def serve(request: web.Request, clip: ClipData, params: RenderParams) -> web.StreamResponse:
    plain = not (params.output_mb or params.serve_kb_per_s or params.serve_stall_after_mb is not None)
    if plain:
        if isinstance(clip, Path):
            return web.FileResponse(clip, headers={"Content-Type": "video/mp4"})
        return web.Response(body=clip, content_type="video/mp4")
    size = clip.stat().st_size if isinstance(clip, Path) else len(clip)
    pad = max(8, params.output_mb * MB - size) if params.output_mb else 0
    resp = web.StreamResponse(headers={"Content-Type": "video/mp4", "Content-Length": str(size + pad)})
    await resp.prepare(request)
    stall_at = None if params.serve_stall_after_mb is None else round(params.serve_stall_after_mb * MB)
    pace = _Pace(params.serve_kb_per_s)
    sent = 0
    async for piece in _pieces(_body(clip, pad), pace.chunk):
        if stall_at is not None and sent + len(piece) > stall_at:
            await resp.write(piece[: stall_at - sent])
            await _hold(request)
            return resp
        await resp.write(piece)
        sent += len(piece)
        await pace.wait(sent)
    await resp.write_eof()
    return resp


class _Pace:
    """Sleeps so that what was sent never runs ahead of `kb_per_s`; no limit without one."""

    def __init__(self, kb_per_s: float | None):
        self.rate = kb_per_s * 1000 if kb_per_s else None
        self.chunk = max(1024, min(CHUNK, round(self.rate / PACED_CHUNKS_PER_S))) if self.rate else CHUNK
        self.started = asyncio.get_running_loop().time()

    async def wait(self, sent: int) -> None:
        if self.rate is not None:
            await asyncio.sleep(max(0.0, self.started + sent / self.rate - asyncio.get_running_loop().time()))


async def _body(clip: ClipData, pad: int) -> AsyncIterator[bytes]:
    """The clip, then (when padded) one top-level `free` box of `pad` bytes; players skip such boxes."""
    if isinstance(clip, Path):
        file: BinaryIO = await asyncio.to_thread(open, clip, "rb")
        try:
            while chunk := await asyncio.to_thread(file.read, CHUNK):
                yield chunk
        finally:
            await asyncio.to_thread(file.close)
    else:
        yield clip
    if pad:
        yield pad.to_bytes(4, "big") + b"free"  # box size (header included) and type
        left, zeros = pad - 8, bytes(CHUNK)
        while left > 0:
            yield zeros[: min(left, CHUNK)]
            left -= CHUNK


async def _pieces(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        for start in range(0, len(chunk), size):
            yield chunk[start: start + size]


async def _hold(request: web.Request) -> None:
    """Send nothing more until the client closes the connection (or STALL_HOLD_S passes)."""
    for _ in range(round(STALL_HOLD_S / HOLD_CHECK_S)):  # no event says a peer left: look now and then
        if request.transport is None or request.transport.is_closing():
            return
        await asyncio.sleep(HOLD_CHECK_S)
