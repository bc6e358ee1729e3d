"""Real clips kept on disk: each distinct clip is encoded once, however many renders ask for it at once, and
the directory is held under a size cap by removing the clips used longest ago.

A clip's file is named by a digest of its spec, written under a temporary name and renamed into place, so a
reader never sees half a clip, and two provider processes sharing the directory at worst encode one clip
twice. A clip removed while it is being served stays readable to that response (the open file outlives its
name), and is encoded again when next asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
from pathlib import Path

import msgspec

from vidjobs.fakeprovider.clips import ClipSpec, encode_into

log = logging.getLogger("vidjobs.fake_provider")

SUFFIX = ".mp4"
ENCODING = 2  # part of every clip's name: raised when clips.py encodes differently, so no stale clip is served


def default_dir() -> Path:
    """Shared by every fake provider of this user on this machine, so a clip outlives the provider's restarts."""
    return Path(tempfile.gettempdir()) / f"vidjobs-fake-clips-{os.getuid()}"


class ClipCache:
    def __init__(self, directory: Path, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self._making: dict[ClipSpec, asyncio.Future[Path]] = {}  # encodes under way
        self.encoded = 0  # clips this cache encoded (the rest were found on disk or joined an encode under way)

    def path_of(self, spec: ClipSpec) -> Path:
        digest = hashlib.sha256(msgspec.json.encode((ENCODING, spec))).hexdigest()[:32]
        return self.directory / f"{digest}{SUFFIX}"

    async def get(self, spec: ClipSpec) -> Path:
        """The clip's file, encoded off the event loop if it is not on disk yet. Concurrent calls for one spec
        share one encode."""
        path = self.path_of(spec)
        if path.exists():
            with contextlib.suppress(FileNotFoundError):  # evicted this instant: encode it again below
                os.utime(path)  # its use is its age: eviction removes the clips used longest ago
                return path
        making = self._making.get(spec)
        if making is None:
            # The encode is the cache's, not the caller's: a caller that gives up does not stop it for the rest.
            making = asyncio.ensure_future(asyncio.to_thread(self._make, spec, path))
            self._making[spec] = making
            making.add_done_callback(lambda _: self._making.pop(spec, None))
        return await asyncio.shield(making)

    def _make(self, spec: ClipSpec, path: Path) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.directory, prefix=".encoding-", suffix=SUFFIX)
        os.close(fd)
        try:
            encode_into(spec, Path(temp))
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        self.encoded += 1
        log.info("real clip encoded", extra={"width": spec.width, "height": spec.height,
                                             "duration_s": spec.duration_s, "bytes": path.stat().st_size})
        self._evict(keep=path)
        return path

    def _evict(self, keep: Path) -> None:
        """Remove the clips used longest ago until the rest fit under max_bytes (the newest always stays)."""
        clips = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat()
                    clips.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        total = sum(size for _, size, _ in clips)
        for _, size, path in sorted(clips, key=lambda clip: clip[0]):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size
