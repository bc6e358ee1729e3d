"""The processes `vidjobs up` starts: how they are started so that they end with it, and how one left behind by
an earlier run is told apart from an unrelated process that happens to have its pid now.

Each child starts in a session of its own, so Ctrl-C in the terminal (a SIGINT to the whole foreground process
group) reaches only `vidjobs up`, which then stops the children in order: the services before the NATS server
they talk to, none of them racing the others to exit. On Linux each child also asks the kernel for SIGTERM when
its parent dies (strictly, the thread that started it: start children from a thread that lives as long as the
process, as the event loop's does), so even a SIGKILLed `vidjobs up` takes them with it; elsewhere the next
start finds them from the pids recorded under the data directory (vidjobs.cli.runstate).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Looked up once here: loading a library in the child, between fork and exec, could wait forever on a loader
# lock another thread of the parent held at the fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


class Recorded(msgspec.Struct, frozen=True):
    """A process as it was when started: its pid, the argv it was started with, and its start time (kernel
    ticks since boot on Linux, the start date `ps` prints elsewhere). The pid with its start time never
    names two processes, so a pid the system has since handed to another process is not mistaken for ours."""

    pid: int
    command: str  # the argv joined by spaces, as `ps` shows it
    started: str


def die_with_parent(parent: int) -> None:
    """Run in the child between fork and exec: SIGTERM this process when `parent`, which started it, dies."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def child_options() -> dict[str, Any]:
    """Keyword arguments for subprocess.Popen or asyncio.create_subprocess_exec that start a child as above."""
    options: dict[str, Any] = {"start_new_session": True}
    if _prctl is not None:
        preexec: Callable[[], None] = functools.partial(die_with_parent, os.getpid())
        options["preexec_fn"] = preexec
    return options


def record(pid: int) -> Recorded | None:
    """The running process `pid` as a record to find it by later; None if it is gone. Popen returns only once
    the child has run exec, so a child's command line is already its own."""
    started, command = _start_time(pid), _command(pid)
    return Recorded(pid, command, started) if started is not None and command is not None else None


def is_alive(process: Recorded) -> bool:
    """Whether the recorded process still runs: the same pid, start time and command line."""
    if _start_time(process.pid) != process.started:
        return False
    return _command(process.pid) == process.command


def end(processes: list[Recorded], *, first: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
    """Stop the recorded processes that still run, together: `first`, then SIGKILL to any not gone after
    `grace_s`. A process is signalled only while it is still the one recorded."""
    _signal(processes, first)
    deadline = time.monotonic() + grace_s
    while any(is_alive(p) for p in processes):
        if time.monotonic() > deadline:
            _signal(processes, signal.SIGKILL)
            deadline = time.monotonic() + grace_s
        time.sleep(0.05)


def _signal(processes: list[Recorded], sig: int) -> None:
    for process in processes:
        if is_alive(process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)


def command_line(pid: int) -> str | None:
    """`pid`'s argv joined by spaces, as `ps` shows it; None if no such process runs (or it cannot be read)."""
    return _command(pid)


def _start_time(pid: int) -> str | None:
    stat = _read(Path(f"/proc/{pid}/stat"))
    if stat is not None:
        # Field 22, counted after the command name, which is in parentheses and may hold spaces itself.
        fields = stat.rpartition(")")[2].split()
        return fields[19] if len(fields) > 19 and not _zombie(fields[0]) else None
    if Path("/proc/self/stat").exists():
        return None  # a system with /proc: the process is gone
    return _ps(pid, "lstart=")


def _command(pid: int) -> str | None:
    cmdline = _read(Path(f"/proc/{pid}/cmdline"))
    if cmdline is not None:
        return " ".join(cmdline.rstrip("\0").split("\0")) if cmdline else None
    if Path("/proc/self/cmdline").exists():
        return None
    return _ps(pid, "args=")  # without /proc, `ps` shows the argv joined by spaces


def _zombie(state: str) -> bool:
    return state in ("Z", "X")


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return None


def _ps(pid: int, column: str) -> str | None:
    try:
        out = subprocess.run(["ps", "-o", column, "-p", str(pid)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
