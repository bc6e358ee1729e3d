"""The derive (verify, thumbnail, preview) on a real-size clip: what it makes looks like what the straightforward
path made (full-size poster scaled by Pillow, every preview frame through libswscale's bilinear scaler), SSIM
>= 0.95 frame by frame, at the same sizes; and cutting corners never lets a broken clip through."""

from __future__ import annotations

import random
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import pytest
from PIL import Image, ImageChops, ImageDraw

from tests.ssim import ssim
from vidjobs.common.errors import ErrorCode, MediaError
from vidjobs.fakeprovider.clip_cache import ClipCache
from vidjobs.fakeprovider.clips import real_spec
from vidjobs.media.pipeline import Derived, PreviewSpec, derive
from vidjobs.media.preview import PREVIEW_FPS, X264_OPTIONS, PreviewWriter, preview_size
from vidjobs.media.thumbnail import write_thumbnail
from vidjobs.media.verify import POSTER_AT_S, Needed, TrackReader, inspect_video

FPS = 24


def busy_picture(width: int, height: int) -> Image.Image:
    """Edges, fine stripes and text-sized detail: what a careless downscale aliases or smears."""
    rng = random.Random(29)
    picture = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    draw = ImageDraw.Draw(picture)
    for _ in range(400):
        x, y = rng.randrange(width), rng.randrange(height)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.rectangle((x, y, x + rng.randrange(4, 120), y + rng.randrange(4, 60)), fill=colour)
    for x in range(0, width, 6):  # stripes near the preview's sampling rate
        draw.line((x, 0, x, height // 5), fill=(255, 255, 255), width=2)
    return picture


def write_clip(path: Path, *, width: int, height: int, seconds: float, faststart: bool = False) -> None:
    base = busy_picture(width, height)
    options = {"movflags": "+faststart"} if faststart else {}
    with av.open(str(path), "w", format="mp4", options=options) as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "23", "g": "48"}
        for i in range(int(seconds * FPS)):
            out.mux(stream.encode(av.VideoFrame.from_image(ImageChops.offset(base, i * 5, i))))
        out.mux(stream.encode())


def reference_outputs(video: Path, work: Path, spec: PreviewSpec) -> tuple[Path, Path]:
    """Thumbnail and preview as the first version of `derive` made them: every frame of the first seconds
    decoded, the poster converted to RGB at full size and scaled by Pillow, each preview frame scaled by
    `VideoFrame.reformat`'s default (bilinear) and encoded with the same x264 settings."""
    thumb, clip = work / "ref.jpg", work / "ref.mp4"
    with av.open(str(video)) as source, av.open(str(clip), "w", format="mp4") as out:
        stream = source.streams.video[0]
        size = preview_size(stream.codec_context.width, stream.codec_context.height, spec.max_side)
        encoder = out.add_stream("libx264", rate=PREVIEW_FPS)
        encoder.width, encoder.height, encoder.pix_fmt = size[0], size[1], "yuv420p"
        encoder.options = dict(X264_OPTIONS)
        written, poster = 0, None
        # A second in, or a quarter of a shorter clip: the frame the poster is meant to be.
        poster_at = min(POSTER_AT_S, float(stream.duration * stream.time_base) / 4)
        for frame in source.decode(stream):
            at = frame.time or 0.0
            if poster is None and at >= poster_at:
                poster = frame.to_image()
            if at >= spec.seconds:
                break
            if at + 1e-6 >= written / PREVIEW_FPS:
                small = frame.reformat(width=size[0], height=size[1], format="yuv420p")
                small.pts, small.time_base = written, Fraction(1, PREVIEW_FPS)
                out.mux(encoder.encode(small))
                written += 1
        out.mux(encoder.encode(None))
    assert poster is not None
    write_thumbnail(poster, thumb)
    return thumb, clip


def pictures(video: Path) -> Iterator[Image.Image]:
    with av.open(str(video)) as container:
        for frame in container.decode(video=0):
            yield frame.to_image()


SIZES = {"720p": (1280, 720, 4.0), "1080p": (1920, 1080, 3.5)}  # shrunk 4x and 6x to the preview and poster


@pytest.fixture(scope="module")
def busy_clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    for name, (width, height, seconds) in SIZES.items():
        write_clip(folder / f"{name}.mp4", width=width, height=height, seconds=seconds)
    return {name: folder / f"{name}.mp4" for name in SIZES}


@pytest.fixture(scope="module")
def derived_and_reference(busy_clips: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                          ) -> dict[str, tuple[Derived, Path, Path]]:
    made = {}
    for name, clip in busy_clips.items():
        work = tmp_path_factory.mktemp(name)
        made[name] = (derive(clip, work, PreviewSpec()), *reference_outputs(clip, work, PreviewSpec()))
    return made


@pytest.mark.parametrize("size", ["720p", "1080p"])
def test_the_thumbnail_keeps_its_size_and_look(derived_and_reference: dict[str, tuple[Derived, Path, Path]],
                                               size: str):
    derived, ref_thumb, _ = derived_and_reference[size]
    with Image.open(derived.thumbnail.path) as ours, Image.open(ref_thumb) as theirs:
        assert ours.size == theirs.size == (derived.thumbnail.width, derived.thumbnail.height) == (320, 180)
        assert ssim(ours, theirs) >= 0.95


@pytest.mark.parametrize("size", list(SIZES))
def test_the_preview_keeps_its_size_and_look(derived_and_reference: dict[str, tuple[Derived, Path, Path]],
                                             size: str):
    spec = PreviewSpec()
    derived, _, ref_clip = derived_and_reference[size]
    ours_frames, ref_frames = list(pictures(derived.preview.path)), list(pictures(ref_clip))
    assert len(ours_frames) == len(ref_frames) == spec.seconds * PREVIEW_FPS
    assert (derived.preview.width, derived.preview.height) == ours_frames[0].size == ref_frames[0].size
    assert derived.preview.duration_s == pytest.approx(spec.seconds)
    for ours_frame, ref_frame in list(zip(ours_frames, ref_frames, strict=True))[::6]:  # every half second
        assert ssim(ours_frame, ref_frame) >= 0.95
    width, height, seconds = SIZES[size]
    assert (derived.info.width, derived.info.height, derived.info.codec) == (width, height, "h264")
    assert derived.info.duration_s == pytest.approx(seconds, abs=0.1)


@pytest.fixture(scope="module")
def faststart_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its index up front, so a copy cut short still opens and its first seconds still decode."""
    path = tmp_path_factory.mktemp("clips") / "faststart.mp4"
    write_clip(path, width=320, height=180, seconds=6, faststart=True)
    return path


@pytest.mark.parametrize("keep", [0.8, 0.97])
def test_a_clip_cut_short_at_its_end_fails_verification(faststart_clip: Path, tmp_path: Path, keep: float):
    data = faststart_clip.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: int(len(data) * keep)])
    for check in (lambda: derive(cut, tmp_path, PreviewSpec()), lambda: inspect_video(cut)):
        with pytest.raises(MediaError) as caught:
            check()
        assert caught.value.code is ErrorCode.VERIFICATION_FAILED
        assert "ends before" in caught.value.message


def test_a_whole_faststart_clip_passes(faststart_clip: Path, tmp_path: Path):
    derived = derive(faststart_clip, tmp_path, PreviewSpec())
    assert derived.info.duration_s == pytest.approx(6.0, abs=0.1)
    assert inspect_video(faststart_clip).info.width == 320


def taken_by_the_preview(times: list[float]) -> set[float]:
    """The frames `PreviewWriter.offer` keeps, by its own rule: the first at or past each point of its grid."""
    taken, next_at = set(), 0.0
    for at in times:
        if at < PreviewSpec().seconds and at + 1e-6 >= next_at:
            taken.add(at)
            next_at += 1.0 / PREVIEW_FPS
    return taken


@pytest.mark.parametrize("fps", [Fraction(10), Fraction(12), Fraction(24000, 1001), Fraction(24), Fraction(25),
                                 Fraction(30000, 1001), Fraction(30), Fraction(50), Fraction(60)])
def test_the_preview_says_it_needs_exactly_the_frames_it_takes(tmp_path: Path, fps: Fraction):
    lasts = float(1 / fps)
    times = [float(i / fps) for i in range(int(4 * fps))]
    writer = PreviewWriter(tmp_path / "unused.mp4", seconds=PreviewSpec().seconds, max_side=320)

    needed = {at for at in times if writer.needs(at, lasts)}

    assert needed == taken_by_the_preview(times)


def frames_decoded(video: Path, work: Path, monkeypatch: pytest.MonkeyPatch, *, skipping: bool) -> tuple[Derived, int]:
    """Derive the video, counting the frames decoded; `skipping=False` decodes every frame as before."""
    decoded = 0
    frames = TrackReader.frames

    def counted(self: TrackReader, needed: Needed | None = None) -> Iterator[av.VideoFrame]:
        nonlocal decoded
        for frame in frames(self, needed if skipping else None):
            decoded += 1
            yield frame

    with monkeypatch.context() as patch:
        patch.setattr(TrackReader, "frames", counted)
        work.mkdir()
        return derive(video, work, PreviewSpec()), decoded


async def test_frames_no_output_takes_and_nothing_references_are_not_decoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """On a provider-like clip (B-frames, some of them referenced by no other frame), the derive leaves out the
    unreferenced frames neither the preview nor the poster takes; what it makes is byte for byte what
    decoding every frame makes."""
    video = await ClipCache(tmp_path / "clips", 1 << 30).get(real_spec("16:9", "480p", 4, seed=29))

    skipped, fewer = frames_decoded(video, tmp_path / "skipping", monkeypatch, skipping=True)
    whole, every = frames_decoded(video, tmp_path / "every", monkeypatch, skipping=False)

    assert fewer < every
    assert skipped.thumbnail.sha256 == whole.thumbnail.sha256
    assert skipped.preview.sha256 == whole.preview.sha256
    assert skipped.info == whole.info
