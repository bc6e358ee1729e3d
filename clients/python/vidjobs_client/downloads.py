"""Downloading a job's video to a file, checked against the sha256 and size the job states.

The bytes go to `<name>.part` beside the target and are renamed into place only when they match, so a path
either holds the whole verified file or nothing new. A connection that breaks resumes with a `Range` request
where the server honours one. Signed URLs expire: a refused one is replaced by reading the job again, once.
The API key is never sent with these requests; the URLs are signed, and may point at another host.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from .errors import ChecksumMismatch, JobNotReady
from .models import Job

Part = Literal["video", "thumbnail", "preview"]
_SUFFIX = {"video": ".mp4", "thumbnail": ".jpg", "preview": ".mp4"}
CHUNK = 1 << 20


def target_path(job: Job, dest: str | Path | None, part: Part) -> Path:
    name = f"{job.id}{'' if part == 'video' else '-' + part}{_SUFFIX[part]}"
    if dest is None:
        return Path(name)
    path = Path(dest)
    return path / name if path.is_dir() else path


def source(job: Job, part: Part) -> str:
    """The signed URL of the part, or raise when the job has none."""
    url = None
    if job.status == "completed" and job.outputs is not None:
        url = {"video": job.outputs.video_url, "thumbnail": job.outputs.thumbnail_url,
               "preview": job.outputs.preview_url}[part]
    if url is None:
        raise JobNotReady(job.id, job.status)
    return url


class Download:
    """One file's progress: bytes written, running hash, and what the result must match."""

    def __init__(self, job: Job, part: Part, target: Path) -> None:
        self.job = job
        self.part = part
        self.target = target
        self.partial = target.with_name(target.name + ".part")
        outputs = job.outputs
        self.expected = (outputs.sha256, outputs.bytes) if part == "video" and outputs else None
        self.total: int | None = self.expected[1] if self.expected else None
        self.written = 0
        self._hash = hashlib.sha256()
        self.refreshed = False

    def range_header(self) -> dict[str, str]:
        return {"Range": f"bytes={self.written}-"} if self.written else {}

    def answered(self, status: int, length: str | None) -> bool:
        """Whether the answer continues what was written (206); False means start over."""
        if status == 206 and self.written:
            return True
        self.written, self._hash = 0, hashlib.sha256()
        if self.total is None and length is not None and length.isdigit():
            self.total = int(length)
        return False

    def add(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.written += len(chunk)

    def check(self) -> None:
        """Raise `ChecksumMismatch` (and remove the bytes) unless they are the file the job describes."""
        if self.expected is None:
            return
        sha256, size = self.expected
        digest = self._hash.hexdigest()
        if digest != sha256 or self.written != size:
            self.partial.unlink(missing_ok=True)
            raise ChecksumMismatch(f"job {self.job.id}: the download is {self.written} bytes with sha256 {digest},"
                                   f" the job states {size} bytes with sha256 {sha256}; nothing was kept")
