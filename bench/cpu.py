"""CPU seconds spent by each part of a running stack, read from the kernel's accounting (psutil), so a
benchmark can print CPU per job for every process beside its throughput.

The parts are found by what they are, not by who started them: the service processes by their module, the
PostgreSQL server by its data directory (with every backend it forked), nats-server by its config path.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import psutil

SERVICES = ("gateway", "submitter", "poller", "media", "reaper")


def _part(proc: psutil.Process, root: str) -> str | None:
    """Which part of the stack under `root` (a data directory) this process is, or None."""
    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    joined = " ".join(cmdline)
    for name in SERVICES:
        if f"vidjobs.{name}" in cmdline:
            return name
    if "vidjobs.fakeprovider" in cmdline:
        return "fake provider"
    if root in joined and "nats-server" in joined:
        return "nats-server"
    if root in joined and Path(cmdline[0]).name == "postgres":
        return "postgres"
    return None


@dataclass
class Snapshot:
    seconds: dict[str, float]  # part -> user + system CPU seconds so far


def snapshot(root: str | Path, *, services_of: int | None = None) -> Snapshot:
    """CPU so far of every part: the services among `services_of`'s descendants (default: this process's),
    and the servers whose command line names `root`, with their children (PostgreSQL's backends)."""
    root = str(root)
    totals: dict[str, float] = defaultdict(float)
    seen: set[int] = set()
    me = psutil.Process(services_of) if services_of else psutil.Process()
    candidates = [*me.children(recursive=True), *psutil.process_iter()]
    for proc in candidates:
        if proc.pid in seen:
            continue
        part = _part(proc, root)
        if part is None:
            continue
        family = [proc, *_children(proc)] if part in ("postgres", "nats-server") else [proc]
        for member in family:
            if member.pid in seen:
                continue
            seen.add(member.pid)
            totals[part] += _cpu(member)
    return Snapshot(dict(totals))


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0.0
    return times.user + times.system


def per_job(before: Snapshot, after: Snapshot, jobs: int) -> list[tuple[str, float]]:
    """(part, CPU milliseconds per job) between two snapshots, largest first, with the total last."""
    rows = [(part, (after.seconds.get(part, 0.0) - before.seconds.get(part, 0.0)) * 1000 / max(jobs, 1))
            for part in sorted(set(before.seconds) | set(after.seconds))]
    rows.sort(key=lambda row: -row[1])
    return [*rows, ("total", sum(ms for _, ms in rows))]


# --- resident memory of a service ------------------------------------------------------------------------


class RssWatch:
    """Samples a service's resident memory (every process of it under this one) in a thread until stopped,
    and says its first, largest and last figures, with the kernel's own peak (VmHWM)."""

    def __init__(self, service: str, interval_s: float = 0.25):
        import threading

        self.service, self.interval_s = service, interval_s
        self.samples: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def pids(self) -> list[int]:
        return [p.pid for p in psutil.Process().children(recursive=True) if _part(p, "/") == self.service]

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            total = 0.0
            for pid in self.pids():
                with contextlib.suppress(psutil.Error):
                    total += psutil.Process(pid).memory_info().rss / 2**20
            if total:
                self.samples.append(total)

    def stop(self) -> str:
        self._done.set()
        self._thread.join()
        hwm = [peak_rss_mb(pid) for pid in self.pids()]
        if not self.samples:
            return f"{self.service} RSS: no samples"
        return (f"{self.service} RSS: {self.samples[0]:.0f} MB at the start, {max(self.samples):.0f} MB at most, "
                f"{self.samples[-1]:.0f} MB at the end (kernel peak {max(hwm, default=0.0):.0f} MB)")


def peak_rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --- database and message counts ---------------------------------------------------------------------------

_DB_COUNTS = """
SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, tup_returned + tup_fetched AS tup_read
FROM pg_stat_database WHERE datname = current_database()
"""


async def database_counts(database_url: str) -> dict[str, int]:
    """PostgreSQL's own counters for the stack's database: transactions committed and rows written and read.
    (Its statistics are sent by each backend at the end of a transaction, at most once a second.)"""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(_DB_COUNTS)
        return dict(row)
    finally:
        await conn.close()


async def message_counts(nats_url: str) -> dict[str, int]:
    """Messages ever stored in each JetStream stream (its last sequence number)."""
    import nats
    import nats.js.errors

    from vidjobs.common import bus

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        # Older commits also kept a stream of change hints; count it where it exists.
        counts = {}
        for name in (bus.WORK_STREAM, "VIDJOBS_CHANGES", bus.DEAD_STREAM):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                counts[name] = (await js.stream_info(name)).state.last_seq
        return counts
    finally:
        await nc.close()


def per_job_counts(before: dict[str, int], after: dict[str, int], jobs: int) -> list[tuple[str, float]]:
    return [(name, (after[name] - before.get(name, 0)) / max(jobs, 1)) for name in after]
