"""The preview: the first seconds of a render, small and light, for hover-to-play in a job list.

H.264 in MP4 (every browser plays it), no audio, its longer side at most `max_side` pixels, both sides even
(yuv420p needs that), `+faststart` so a browser starts playing before the whole file arrived. Frames are fed
from the one decode pass that also verifies the render and picks its poster (`pipeline.derive`). Blocking:
run it on the media service's transcode executor.

x264 runs on one thread with its fastest preset: a preview is a few dozen frames of at most 320 pixels,
where the encoder's thread start-up and look-ahead cost more than they save, and the media service already
runs one transcode per core. For the same reason libswscale scales on this thread too. Its bilinear filter
stays: cheaper ones cost the preview its look (area averaging: SSIM 0.92 against it on fine detail shrunk 4x,
below the 0.95 tests/test_media_derive.py holds it to; fast-bilinear and point sampling alias outright).
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import av
import av.container
import msgspec
from av.video.reformatter import VideoReformatter

PREVIEW_FPS = 12
SCALER = "BILINEAR"  # widens with the shrink, so it anti-aliases
CRF = "30"  # small files; a preview is for recognising the clip, not for watching it
X264_OPTIONS = {"preset": "ultrafast", "crf": CRF, "threads": "1"}


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


class PreviewWriter:
    """Encodes the frames it is offered until `seconds` of picture, at PREVIEW_FPS. The output is opened at
    the first frame, whose size decides the preview's."""

    def __init__(self, dest: Path, *, seconds: float, max_side: int):
        self.dest = dest
        self.seconds = seconds
        self.max_side = max_side
        self.size = (0, 0)
        self._out: av.container.OutputContainer | None = None
        self._encoder: av.video.stream.VideoStream | None = None
        self._scaler = VideoReformatter()  # keeps its libswscale context from frame to frame
        self._next_at = 0.0
        self._written = 0

    def __enter__(self) -> PreviewWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._out is not None:
            self._out.close()

    def wants(self, at: float) -> bool:
        """Whether a frame at `at` seconds is still within the preview."""
        return at < self.seconds

    def needs(self, at: float, lasts: float) -> bool:
        """Whether a frame shown from `at` for `lasts` seconds is one `offer` would take: the first frame at
        or past a point of the preview's 1/PREVIEW_FPS grid. (Exact for a constant frame rate; on a variable
        one a frame it would have taken may be skipped, and the next frame is taken in its place.)"""
        if not self.wants(at):
            return False
        step = 1.0 / PREVIEW_FPS
        previous = at - lasts + 1e-6  # the frame before, with `offer`'s allowance for rounding
        point = (math.floor(previous / step) + 1) * step  # the first grid point the frame before falls short of
        return point <= at + 1e-6

    def offer(self, frame: av.VideoFrame) -> None:
        at = frame.time or 0.0
        if not self.wants(at) or at + 1e-6 < self._next_at:
            return  # past the preview, or above its frame rate
        encoder = self._encoder or self._open(frame)
        small = self._scaler.reformat(frame, width=self.size[0], height=self.size[1], format="yuv420p",
                                      interpolation=SCALER, threads=1)
        small.pts, small.time_base = self._written, Fraction(1, PREVIEW_FPS)
        self._mux(encoder.encode(small))
        self._written, self._next_at = self._written + 1, self._next_at + 1.0 / PREVIEW_FPS

    def finish(self) -> Preview | None:
        """The written preview, or None when no frame reached it."""
        if self._encoder is None or self._out is None:
            return None
        self._mux(self._encoder.encode(None))
        self._out.close()
        self._out = None
        data = self.dest.read_bytes()
        return Preview(path=self.dest, width=self.size[0], height=self.size[1],
                       duration_s=round(self._written / PREVIEW_FPS, 3), bytes=len(data),
                       sha256=hashlib.sha256(data).hexdigest())

    def _open(self, first: av.VideoFrame) -> av.video.stream.VideoStream:
        self.size = preview_size(first.width, first.height, self.max_side)
        self._out = av.open(str(self.dest), "w", format="mp4", options={"movflags": "+faststart"})
        encoder = self._out.add_stream("libx264", rate=PREVIEW_FPS)
        encoder.width, encoder.height, encoder.pix_fmt = self.size[0], self.size[1], "yuv420p"
        encoder.options = dict(X264_OPTIONS)
        self._encoder = encoder
        return encoder

    def _mux(self, packets: list[av.Packet[av.video.stream.VideoStream]]) -> None:
        assert self._out is not None
        self._out.mux(packets)
