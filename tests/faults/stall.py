"""A server that stops answering without dying: its processes stopped with SIGSTOP and resumed with SIGCONT.

A stopped process keeps its sockets: the kernel still completes TCP handshakes on its listening port and
buffers what clients send, so a client sees a connection that accepts and never answers (a stalled disk, a
GC or VM pause, a half-open link), not a refused one. The process is stopped with every process under it
(PostgreSQL: the postmaster, then each backend, the checkpointer and the WAL writer, which run in sessions of
their own, so no one process group holds them); the parent first, so it forks nothing new meanwhile. Linux
only (the tree is read from /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _tree(pid: int) -> list[int]:
    """`pid` and every process under it, parents before their children."""
    children, found = _children(), [pid]
    for each in found:
        found.extend(children.get(each, []))
    return found


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def freeze(pid: int) -> list[int]:
    """Stop `pid` and every process under it; returns the processes stopped, for `thaw`. The parent is
    stopped before its tree is read, so it forks nothing the reading misses."""
    _signal([pid], signal.SIGSTOP)
    stopped = _tree(pid)
    _signal(stopped, signal.SIGSTOP)
    return stopped


def thaw(pids: list[int]) -> None:
    """Resume what `freeze` stopped, children first; a process that has gone meanwhile is left alone."""
    _signal(list(reversed(pids)), signal.SIGCONT)


class Stall:
    """A stall to begin and end by hand (a fault's two steps), which also ends when its block exits, so a
    scenario that fails mid-stall never leaves a server stopped (its teardown would hang on it)."""

    def __init__(self, pid: Callable[[], int]):
        self._pid = pid
        self._stopped: list[int] = []

    def begin(self) -> None:
        self._stopped = freeze(self._pid())

    def end(self) -> None:
        thaw(self._stopped)
        self._stopped = []

    @contextlib.contextmanager
    def guarded(self) -> Iterator[Stall]:
        try:
            yield self
        finally:
            self.end()
