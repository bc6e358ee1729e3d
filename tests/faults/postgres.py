"""A PostgreSQL of the fault suite's own, from the pgserver wheel's binaries, on a free loopback TCP port, that
can be restarted under the services' feet.

PostgreSQL refuses to run as root. pgserver's answer (postgres_server.py) is to run the server as a system
user named `pgserver`, created with `useradd` when missing, after opening the path to it; this does the same
with pgserver's own helpers and subprocess's `user=`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from vidjobs.cli.embedded import free_port

SERVER_USER = "pgserver"


def _bin(name: str) -> str:
    from pgserver._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _run_as() -> str | None:
    """The user the server must run as: ourselves, unless we are root."""
    if os.geteuid() != 0:
        return None
    from pgserver._commands import POSTGRES_BIN_PATH
    from pgserver.utils import ensure_prefix_permissions, ensure_user_exists
    ensure_user_exists(SERVER_USER)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    return SERVER_USER


class LocalPostgres:
    def __init__(self, home: Path):
        self.home = home
        self.data = home / "pgdata"
        self.port = free_port()
        self.user = _run_as()
        # Off: the suite kills processes, not machines, and a test server need not pay for fsync. On: what a
        # commit costs where it is measured (bench/replication.py).
        self.fsync = False

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([_bin("pg_ctl"), "-D", str(self.data), *args], check=True, user=self.user,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)

    def init(self) -> LocalPostgres:
        self.home.mkdir(parents=True, exist_ok=True)
        self._hand_over(self.home)
        subprocess.run([_bin("initdb"), "-D", str(self.data), "--auth=trust", "--encoding=utf8", "-U", "postgres"],
                       check=True, user=self.user, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.data.chmod(0o700)
        return self

    def _hand_over(self, path: Path) -> None:
        """Give `path` (and what is under it) to the server's user, with a way through its parents."""
        if self.user is None:
            return
        from pgserver.utils import ensure_prefix_permissions

        ensure_prefix_permissions(path)
        for each in [path, *path.rglob("*")]:
            shutil.chown(each, self.user, self.user)

    def start(self) -> LocalPostgres:
        # No unix socket (its default directory may not be writable for the server user): TCP only.
        fsync = "on" if self.fsync else "off"
        options = f"-h 127.0.0.1 -p {self.port} -k '' -c max_connections=300 -c fsync={fsync}"
        self._ctl("-w", "-o", options, "-l", str(self.home / "postgres.log"), "start")
        return self

    def restart(self, mode: str = "fast") -> None:
        """Every connection is cut (fast: terminated cleanly; immediate: as after a crash) and the server is
        back when this returns."""
        self._ctl("-w", "-m", mode, "-l", str(self.home / "postgres.log"), "restart")

    @property
    def pid(self) -> int:
        """The postmaster's pid (the first line of postmaster.pid); it leads the group of every backend."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._ctl("-w", "-m", mode, "stop")
