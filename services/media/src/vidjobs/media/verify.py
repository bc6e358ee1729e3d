"""Prove a downloaded file is a real, playable video before anyone is shown it.

A file passes when an MP4-family demuxer opens it, it has a video track with a positive duration and sane
dimensions, at least one real frame decodes, and every frame its index lists is in the file, whole. Only the
frames the outputs need are decoded (the first seconds); the rest of the track is read without decoding, which
costs a few per cent of a decode and still catches a copy cut short at its end. Only MP4-family demuxers are
allowed, so a playlist or concat file from a provider can never make the decoder read other files or URLs.
Everything here blocks: callers run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import av.container
import av.error
import av.video.stream
import msgspec
from PIL import Image

from vidjobs.common.errors import ErrorCode, MediaError
from vidjobs.media.thumbnail import MAX_SIDE as THUMBNAIL_SIDE
from vidjobs.media.thumbnail import thumbnail_size

# libswscale's bilinear filter widens with the shrink, so it anti-aliases as Pillow's resize does (SSIM 0.99
# against it), at a tenth of the CPU of converting the whole frame to RGB and shrinking it there.
POSTER_SCALER = "BILINEAR"

# The demuxers we accept (FFmpeg's names for the MP4/QuickTime family); we store the file as video.mp4.
ALLOWED_FORMATS = "mov,mp4,m4a,3gp,3g2,mj2"
OPEN_OPTIONS = {"format_whitelist": ALLOWED_FORMATS, "protocol_whitelist": "file"}
MAX_SIDE = 8192  # larger than any render we sell; refuses decoder bombs before a frame is allocated
MAX_FRAMES = 300  # decoded at most while looking for the poster frame
POSTER_AT_S = 1.0  # the thumbnail frame: a second in (or a quarter of a shorter clip), past any fade-in


class VideoInfo(msgspec.Struct, frozen=True, kw_only=True):
    width: int
    height: int
    duration_s: float
    codec: str


@dataclass(frozen=True)
class Inspection:
    info: VideoInfo
    poster: Image.Image  # a decoded frame, already at most the thumbnail's size


def not_video(reason: str) -> MediaError:
    return MediaError(
        ErrorCode.VERIFICATION_FAILED,
        f"The provider returned a file that is not a playable video ({reason}). "
        "Run the job again; if it keeps happening, try another model.",
    )


def inspect_video(path: Path) -> Inspection:
    """Open, check and decode the start of a video; raises MediaError(VERIFICATION_FAILED)."""
    try:
        with av.open(str(path), container_options=OPEN_OPTIONS, metadata_errors="replace") as container:
            return _inspect(container)
    except av.error.FFmpegError as exc:
        raise not_video("it cannot be read as an MP4 video") from exc


def _inspect(container: av.container.InputContainer) -> Inspection:
    stream, duration = checked_stream(container)
    poster = PosterPicker(duration)
    track = TrackReader(container, stream)
    for frame in track.frames(poster.needs):
        if poster.offer(frame):
            break
    track.finish()
    return poster.inspection(stream, duration)


# Whether the frame a packet holds, shown at `at` seconds until `at + lasts`, is one an output takes.
Needed = Callable[[float, float], bool]


class TrackReader:
    """Reads the video track once: `frames()` decodes from its start for as long as the caller iterates;
    `finish()` then reads the rest of the packets without decoding them and raises unless every frame the
    index lists came whole. (A copy cut short at its end opens and decodes its first seconds like a whole
    one when its index is up front, as `+faststart` puts it.)

    A frame no other frame is predicted from (a provider's non-reference B-frame) is not decoded when
    `needed` says no output takes it: nothing else depends on it, so every frame an output takes decodes
    exactly as before, at a fifth to a third less decoding on B-frame clips. Reference frames are always
    decoded; a packet whose time or duration is unknown is always decoded."""

    def __init__(self, container: av.container.InputContainer, stream: av.video.stream.VideoStream):
        self.stream = stream
        self.listed = stream.frames  # from the index; 0 when it does not say (a fragmented MP4)
        self.read = 0
        self._packets = container.demux(stream)

    def frames(self, needed: Needed | None = None) -> Iterator[av.VideoFrame]:
        context = self.stream.codec_context
        for packet in self._whole_packets():
            if needed is not None:
                # Read by the decoder as each packet is sent (one thread, so no frame is decoded ahead).
                context.skip_frame = "DEFAULT" if self._needed(packet, needed) else "NONREF"
            yield from self.stream.decode(packet)

    def _needed(self, packet: av.Packet[av.video.stream.VideoStream], needed: Needed) -> bool:
        base = packet.time_base
        if packet.pts is None or not packet.duration or base is None:
            return True
        return needed(float(packet.pts * base), float(packet.duration * base))

    def finish(self) -> None:
        for _ in self._whole_packets():
            pass
        if self.read < self.listed:
            raise not_video(f"it ends before its last frame: {self.read} of its {self.listed} frames are there")

    def _whole_packets(self) -> Iterator[av.Packet[av.video.stream.VideoStream]]:
        while True:
            try:
                packet = next(self._packets, None)
            except av.error.FFmpegError as exc:
                if not self.read:
                    raise
                raise not_video(f"it ends before its last frame: its data breaks off after {self.read} frames") \
                    from exc
            if packet is None:
                return
            if packet.size:  # the empty packet at the end only drains the decoder
                if packet.is_corrupt:
                    raise not_video(f"it ends before its last frame: frame {self.read + 1} is cut short")
                self.read += 1
            yield packet


def checked_stream(container: av.container.InputContainer) -> tuple[av.video.stream.VideoStream, float]:
    """The video track and its duration, once its header passes; decoded on this thread alone (a render is
    decoded once, from its start: a decoder's frame threads would cost more to start than they save)."""
    if not container.streams.video:
        raise not_video("it has no video track")
    stream = container.streams.video[0]
    _check_size(stream.codec_context.width, stream.codec_context.height, known_only=True)
    duration = duration_of(container, stream)
    if duration <= 0:
        raise not_video("it has no duration")
    stream.codec_context.thread_count = 1
    return stream, duration


class PosterPicker:
    """Chooses the thumbnail frame among the decoded ones: the first at POSTER_AT_S (or a quarter of a
    shorter clip), or the last of MAX_FRAMES. The poster comes out at most `max_side` pixels on its longer
    side, scaled in libswscale straight from the decoded YUV: converting a full 1080p frame to RGB and then
    shrinking it cost ten times as much."""

    def __init__(self, duration_s: float, *, max_side: int = THUMBNAIL_SIDE):
        self.at_s = min(POSTER_AT_S, duration_s / 4)
        self.max_side = max_side
        self.chosen: av.VideoFrame | None = None
        self.done = False
        self._count = 0

    def needs(self, at: float, lasts: float) -> bool:
        """Whether a frame at `at` could be the poster: the first frame at or past `at_s`."""
        return not self.done and at - lasts < self.at_s <= at + 1e-6

    def offer(self, frame: av.VideoFrame) -> bool:
        """Take a decoded frame; True once the poster is chosen."""
        if not self.done:
            self._count += 1
            self.chosen = frame
            self.done = frame.time is None or frame.time >= self.at_s or self._count >= MAX_FRAMES
        return self.done

    def inspection(self, stream: av.video.stream.VideoStream, duration_s: float) -> Inspection:
        frame = self.chosen
        if frame is None:
            raise not_video("no frame of it could be decoded")
        _check_size(frame.width, frame.height, known_only=False)
        info = VideoInfo(width=frame.width, height=frame.height, duration_s=duration_s,
                         codec=stream.codec_context.name)
        width, height = thumbnail_size(frame.width, frame.height, self.max_side)
        small = frame.reformat(width=width, height=height, format="rgb24", interpolation=POSTER_SCALER, threads=1)
        # PyAV's stub leaves to_image untyped; it returns a PIL image.
        poster: Image.Image = small.to_image()  # type: ignore[no-untyped-call]
        return Inspection(info=info, poster=poster)


def _check_size(width: int, height: int, *, known_only: bool) -> None:
    # Before decoding, a header may not state its size yet (0); after decoding it must.
    if known_only and not (width and height):
        return
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise not_video(f"its picture size {width}x{height} is out of range")


def duration_of(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float:
    """Seconds, from the video track if it says, else from the container; 0 when neither knows."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return 0.0
