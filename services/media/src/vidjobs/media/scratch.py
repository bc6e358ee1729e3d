"""Local scratch space for copies in progress. Each process works under a directory named for its pid; a
process killed mid-copy cannot clean up after itself, so every media process removes the directories of
dead ones when it starts."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("vidjobs.media")

PREFIX = "vidjobs-media-"


def root() -> Path:
    return Path(tempfile.gettempdir())


def own_prefix() -> str:
    """Prefix of this process's copy directories: `vidjobs-media-<pid>-`."""
    return f"{PREFIX}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _owner(path: Path) -> int | None:
    parts = path.name.removeprefix(PREFIX).split("-", 1)
    return int(parts[0]) if parts and parts[0].isdigit() else None


def remove_stale(where: Path | None = None) -> int:
    """Remove the copy directories of processes that no longer run; returns how many."""
    removed = 0
    for path in (where or root()).glob(f"{PREFIX}*"):
        pid = _owner(path)
        if pid is None or pid == os.getpid() or _alive(pid) or not path.is_dir():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed the scratch space of copies that died with their process", extra={"count": removed})
    return removed
