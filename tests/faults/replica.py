"""A PostgreSQL primary and a streaming standby on loopback, from the pgserver wheel's binaries, failed over as
CloudNativePG fails over: the primary dies (SIGKILL, every process of it) and the standby is promoted.

The standby is made as an operator makes one: `pg_basebackup -R` through a physical replication slot, so the
primary keeps every WAL segment the standby has not received. Replication is synchronous (a commit returns
once the standby has flushed it, `synchronous_standby_names = '*'`) or asynchronous. The services are given
both servers in one multi-host URL with `target_session_attrs=read-write`: asyncpg (0.32, uv.lock) tries each
in turn for every new connection of the services' pools (vidjobs.common.db) and keeps the one that takes
writes, so a failover needs no proxy and no new setting.

Two ways to make the standby lag, for the asynchronous case:
- `lag_receiving()`: the primary's WAL sender is stopped (SIGSTOP) and the primary goes on committing, as
  over a slow or partitioned link. What the primary committed meanwhile is not on the standby when it dies: an
  asynchronous failover loses it.
- `apply_delay_ms`: `recovery_min_apply_delay`. The standby receives and flushes WAL at once and only replays
  it late; a promotion ends the delay and replays everything received first, so this lag loses nothing (it
  shows on the standby's reads, not in what a failover keeps).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import asyncpg

from tests.faults.postgres import LocalPostgres, _bin
from tests.faults.stall import _tree, freeze, thaw

SLOT = "standby"
STANDBY_NAME = "standby"


def _append_conf(data: Path, lines: list[str]) -> None:
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\n# tests.faults.replica\n" + "\n".join(lines) + "\n")


class ReplicatedPostgres:
    """The pair, with LocalPostgres's face (`init().start()`, `admin_url`, `url()`, `stop()`) so a fault run
    uses it in place of one server; its URLs name both servers."""

    def __init__(self, home: Path, *, synchronous: bool, apply_delay_ms: int = 0, fsync: bool = False):
        self.home = home
        self.synchronous = synchronous
        self.apply_delay_ms = apply_delay_ms
        self.primary = LocalPostgres(home)  # home/postgres.log is the one the fault run keeps
        self.standby = LocalPostgres(home.parent / f"{home.name}-standby")
        self.primary.fsync = self.standby.fsync = fsync
        self.promoted = False
        self._sender_stopped: list[int] = []

    # LocalPostgres's face ------------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def url(self, database: str) -> str:
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    @property
    def pid(self) -> int:
        """The postmaster of whichever server takes writes now."""
        return self.writer().pid

    def writer(self) -> LocalPostgres:
        """Whichever server takes writes now."""
        return self.standby if self.promoted else self.primary

    def init(self) -> ReplicatedPostgres:
        self.primary.init()
        _append_conf(self.primary.data, ["wal_level = replica", "max_wal_senders = 10",
                                         "max_replication_slots = 10", "hot_standby = on"])
        return self

    def start(self) -> ReplicatedPostgres:
        self.primary.start()
        self._psql(self.primary, f"SELECT pg_create_physical_replication_slot('{SLOT}')")
        self._base_backup()
        self.standby.start()
        self._wait_streaming()
        if self.synchronous:
            # Only now: with it set before the standby streams, every commit (CREATE DATABASE too) would wait.
            self.set_synchronous(True)
        return self

    def set_synchronous(self, on: bool) -> None:
        """Switch the pair between synchronous and asynchronous replication; new commits follow at once."""
        names = "*" if on else ""
        self._psql(self.primary, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        self._psql(self.primary, "SELECT pg_reload_conf()")
        self.synchronous = on

    def stop(self, mode: str = "fast") -> None:
        self.resume_receiving()
        for server in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                server.stop(mode)

    # the standby -------------------------------------------------------------------------------------------

    def _base_backup(self) -> None:
        self.standby.home.mkdir(parents=True, exist_ok=True)
        self.standby._hand_over(self.standby.home)
        subprocess.run([_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                        "-D", str(self.standby.data), "-R", "-S", SLOT, "-X", "stream", "--checkpoint=fast"],
                       check=True, user=self.standby.user, cwd="/", stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)
        # cluster_name: the WAL receiver's application_name. wal_retrieve_retry_interval: once its primary is
        # gone the standby looks for WAL this often, and a promotion waits for the look in progress (5 s by
        # default, as long as the whole failover otherwise takes).
        lines = [f"cluster_name = '{STANDBY_NAME}'", "wal_retrieve_retry_interval = '100ms'"]
        if self.apply_delay_ms:
            lines.append(f"recovery_min_apply_delay = '{self.apply_delay_ms}ms'")
        _append_conf(self.standby.data, lines)
        self.standby.data.chmod(0o700)

    def _wait_streaming(self, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self._psql(self.primary, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == "1":
                return
            time.sleep(0.2)
        raise RuntimeError("the standby never started streaming")

    def _psql(self, server: LocalPostgres, sql: str) -> str:
        done = subprocess.run([_bin("psql"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-At",
                               "-d", "postgres", "-c", sql], check=True, capture_output=True, text=True, timeout=30,
                              user=server.user, cwd="/")
        return done.stdout.strip()

    async def replay_lag(self) -> tuple[int, float]:
        """(bytes the standby has not flushed, seconds its replay is behind), from the primary's view."""
        conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{self.primary.port}/postgres", timeout=5)
        try:
            row = await conn.fetchrow(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint AS behind, "
                "coalesce(extract(epoch FROM replay_lag), 0)::float AS replay_s FROM pg_stat_replication")
        finally:
            await conn.close()
        return (int(row["behind"]), float(row["replay_s"])) if row else (-1, -1.0)

    # lag and failover ----------------------------------------------------------------------------------

    def _sender_pid(self) -> int:
        pids = [p for p in _tree(self.primary.pid) if "walsender" in _cmdline(p)]
        if not pids:
            raise RuntimeError("the primary has no WAL sender")
        return pids[0]

    def lag_receiving(self) -> None:
        """Stop the primary's WAL sender: from now on the standby receives nothing the primary commits, as over
        a link that stalled. (The sender rather than the standby's receiver: WAL already sent would wait in the
        receiver's socket and reach the standby after the primary died.) Only for an asynchronous pair: a
        synchronous primary would wait on every commit."""
        assert not self.synchronous, "a synchronous primary waits for the standby on every commit"
        self._sender_stopped = freeze(self._sender_pid())

    def resume_receiving(self) -> None:
        thaw(self._sender_stopped)
        self._sender_stopped = []

    def kill_primary(self) -> None:
        """The primary's node dies: the postmaster and every backend SIGKILLed at once, nothing flushed."""
        for pid in _tree(self.primary.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        (self.primary.data / "postmaster.pid").unlink(missing_ok=True)

    def promote(self) -> None:
        """What the operator does next: the standby ends recovery and takes writes (`pg_ctl promote -w`)."""
        self.standby._ctl("-w", "promote")
        self.promoted = True

    def fail_over(self) -> None:
        self.kill_primary()
        self.promote()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
