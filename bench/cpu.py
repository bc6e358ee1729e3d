"""CPU seconds spent by each part of a running stack, read from the kernel's accounting (psutil), so a
benchmark can print CPU per job for every process beside its throughput.

The parts are found by what they are and where they run: the service processes by their module among this
process's descendants (the supervisor runs here; another stack's services on the same machine share the
module names and must not be counted), the PostgreSQL server by its data directory (with every backend it
forked), nats-server by its config path.

Two snapshots are compared process by process, keyed by pid and start time. A PostgreSQL backend that exits
between them is no loss: its parent reaps it and the kernel adds its CPU to the parent's "children" times,
which are counted. A service that exits (a crash and the supervisor's restart) is reaped by this process in
the same way, so its CPU after the first snapshot is recovered from this process's children times and the
restart is reported; it is never silently subtracted.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SERVICES = ("gateway", "submitter", "poller", "media", "reaper")
SERVICE_PARTS = (*SERVICES, "fake provider")


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
    if root in joined and cmdline and Path(cmdline[0]).name == "postgres":
        return "postgres"
    return None


@dataclass(frozen=True)
class Member:
    pid: int
    part: str
    seconds: float  # user + system CPU so far, with that of its children that have exited and been reaped


@dataclass
class Snapshot:
    members: dict[tuple[int, float], Member]  # (pid, start time) -> the process and its CPU so far
    reaped_s: float  # CPU of the supervisor's (this process's) exited and reaped children: restarted services

    @property
    def seconds(self) -> dict[str, float]:
        """part -> CPU seconds so far of its processes alive now."""
        totals: dict[str, float] = defaultdict(float)
        for member in self.members.values():
            totals[member.part] += member.seconds
        return dict(totals)


def snapshot(root: str | Path, *, services_of: int | None = None) -> Snapshot:
    """CPU so far of every part: the services among `services_of`'s descendants (default: this process's),
    and the servers whose command line names `root`, with their descendants (PostgreSQL's backends)."""
    root = str(root)
    supervisor = psutil.Process(services_of) if services_of else psutil.Process()
    ours = set()
    for proc in _children(supervisor):
        part = _part(proc, root)
        if part in SERVICE_PARTS:
            ours.add(proc.pid)
    members: dict[tuple[int, float], Member] = {}
    for proc in psutil.process_iter():
        part = _part(proc, root)
        if part is None or (part in SERVICE_PARTS and proc.pid not in ours):
            continue
        for member in [proc, *_children(proc)]:
            key = _key(member)
            if key is not None and key not in members:
                members[key] = Member(member.pid, part, _cpu(member))
    return Snapshot(members, _reaped(supervisor))


def _key(proc: psutil.Process) -> tuple[int, float] | None:
    try:
        return proc.pid, proc.create_time()
    except psutil.Error:
        return None


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


def _reaped(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.children_user + times.children_system


@dataclass
class Usage:
    seconds: dict[str, float]  # part -> CPU seconds spent between the snapshots
    notes: list[str] = field(default_factory=list)  # restarts, and how their CPU was counted


def usage(before: Snapshot, after: Snapshot) -> Usage:
    """CPU each part spent between two snapshots. A service process in `before` that is gone by `after` had
    exited (and the supervisor restarted it): what it spent after `before` is the growth of the supervisor's
    reaped-children CPU less what it had spent by `before`, given to its part when only one part restarted
    and shown on a row of its own when several did."""
    seconds: dict[str, float] = defaultdict(float)
    for member in after.members.values():
        seconds[member.part] += member.seconds
    for member in before.members.values():
        seconds[member.part] -= member.seconds
    gone = [m for key, m in before.members.items() if key not in after.members and m.part in SERVICE_PARTS]
    notes = []
    if gone:
        recovered = after.reaped_s - before.reaped_s
        parts = sorted({m.part for m in gone})
        for part in parts:
            old = [m.pid for m in gone if m.part == part]
            new = [m.pid for key, m in after.members.items() if m.part == part and key not in before.members]
            notes.append(f"{part} restarted during the run: pid {', '.join(map(str, old))} exited, "
                         f"pid {', '.join(map(str, new)) or 'none'} running now")
        if len(parts) == 1:
            seconds[parts[0]] += recovered
            notes.append(f"{parts[0]}'s figure includes {recovered:.2f} s its exited process spent before it "
                         "was reaped (the supervisor's children times)")
        else:
            seconds[f"exited ({', '.join(parts)})"] += recovered
            notes.append("the exited processes' CPU is one row: the kernel sums reaped children together")
    return Usage(dict(seconds), notes)


def per_job(spent: Usage, jobs: int) -> list[tuple[str, float]]:
    """(part, CPU milliseconds per job), largest first, with the total last."""
    rows = [(part, s * 1000 / max(jobs, 1)) for part, s in sorted(spent.seconds.items())]
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
