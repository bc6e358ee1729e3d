"""A Supervisor whose children write to one log file per service instead of the caller's terminal, so a
scenario's failures can be read afterwards (restarts append to the same file)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from vidjobs.cli.supervisor import Supervisor, log


class LoggingSupervisor(Supervisor):
    def __init__(self, env: dict[str, str], *, log_dir: Path, **options: Any):
        super().__init__(env, **options)
        self.log_dir = log_dir
        self.starts: dict[str, int] = {}  # processes started per service: 1 means it never died
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    async def start(self, name: str) -> None:
        # Supervisor.start, with the child's output sent to its own file.
        child = self.children[name]
        child.wanted = True
        with self.log_path(name).open("ab") as out:  # a local file, opened once per process start
            child.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", child.module, env=self.env(name), stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out,
            )
        child.started_at = time.monotonic()
        self.starts[name] = self.starts.get(name, 0) + 1
        log.info("started %s (pid %s)", name, child.proc.pid)
        child.watcher = asyncio.create_task(self._watch(child), name=f"watch-{name}")
