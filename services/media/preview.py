"""The preview: the first seconds of a render, small and light, for hover-to-play in a job list.

H.264 in MP4 (every browser plays it), no audio, its longer side at most `max_side` pixels, both sides even
(yuv420p needs that), `+faststart` so a browser starts playing before the whole file arrived. Only a verified
video reaches this code, and it is opened with the same demuxer whitelist as verification. Blocking: run it on
the media service's transcode executor.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path

import av
import av.error
import msgspec

from services.media.verify import OPEN_OPTIONS, not_video

PREVIEW_FPS = 12
CRF = "30"  # small files; a preview is for recognising the clip, not for watching it


class Preview(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    width: int
    height: int
    duration_s: float
    bytes: int
    sha256: str


def preview_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """Scale down (never up) to fit `max_side`, keeping the aspect ratio, both sides even and at least 2."""
    scale = min(1.0, max_side / max(width, height))
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def write_preview(video: Path, dest: Path, *, seconds: float, max_side: int) -> Preview:
    try:
        with av.open(str(video), container_options=OPEN_OPTIONS) as source:
            stream = source.streams.video[0]
            width, height = preview_size(stream.codec_context.width, stream.codec_context.height, max_side)
            last_s = _encode(source, stream, dest, width=width, height=height, seconds=seconds)
    except av.error.FFmpegError as exc:
        raise not_video("its frames could not be re-encoded") from exc
    data = dest.read_bytes()
    return Preview(path=dest, width=width, height=height, duration_s=round(last_s, 3), bytes=len(data),
                   sha256=hashlib.sha256(data).hexdigest())


def _encode(source: av.container.InputContainer, stream: av.video.stream.VideoStream, dest: Path, *,
            width: int, height: int, seconds: float) -> float:
    """Re-encode frames until `seconds` of picture; returns the length written, in seconds."""
    with av.open(str(dest), "w", format="mp4", options={"movflags": "+faststart"}) as out:
        encoder = out.add_stream("libx264", rate=PREVIEW_FPS)
        encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
        encoder.options = {"preset": "veryfast", "crf": CRF}
        step, next_at, written = 1.0 / PREVIEW_FPS, 0.0, 0
        for frame in source.decode(stream):
            at = frame.time or 0.0
            if at >= seconds:
                break
            if at + 1e-6 < next_at:
                continue  # drop frames above the preview's frame rate
            small = frame.reformat(width=width, height=height, format="yuv420p")
            small.pts, small.time_base = written, Fraction(1, PREVIEW_FPS)
            out.mux(encoder.encode(small))
            written, next_at = written + 1, next_at + step
        if written == 0:
            raise not_video("no frame of it could be decoded for the preview")
        out.mux(encoder.encode(None))
    return written / PREVIEW_FPS
