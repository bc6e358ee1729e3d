"""Object store outages: a moto S3 server stopped and started again on the same port, and a filesystem
storage root made unusable for a while."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from tests.s3server import MotoS3, _wait_until_answering, aws_environment
from vidjobs.cli.embedded import free_port

SIDELINED = ".outage"  # where the filesystem root waits out an outage, beside itself


class RestartableMoto:
    """moto's S3 server as a subprocess on a fixed port. moto keeps everything in memory, so a restart comes
    back empty: the bucket is made again at every start (objects stored before are gone, which is what a
    re-created bucket looks like; the downloads in flight during the outage are what the fault is about)."""

    def __init__(self, home: Path, bucket: str):
        self.home = home
        self.bucket = bucket
        self.port = free_port()
        self.server: MotoS3 | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3:
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home / "moto.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.home,
            )
        self.server = MotoS3(self.endpoint, proc)
        _wait_until_answering(self.server, log)
        self.server.create_bucket(self.bucket)
        return self.server

    def stop(self) -> None:
        if self.server is None:
            return
        proc = self.server.proc
        proc.kill()  # an outage, not a shutdown: connections in flight are cut
        proc.wait()
        self.server = None


def break_root(root: Path) -> None:
    """Move the storage root aside and put a regular file at its path: every write under it now fails with
    an OSError (NotADirectoryError), as a lost mount or a read-only disk would."""
    root.rename(root.with_name(root.name + SIDELINED))
    root.write_text("storage outage\n")


def mend_root(root: Path) -> None:
    root.unlink()
    root.with_name(root.name + SIDELINED).rename(root)



@contextlib.asynccontextmanager
async def running_moto(bucket: str) -> AsyncIterator[RestartableMoto]:
    """A RestartableMoto serving `bucket`, its credentials and endpoint in this process's environment (which
    the service processes a run starts inherit), stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="vidjobs-faults-moto-") as home:
        moto = RestartableMoto(Path(home), bucket)
        server = await asyncio.to_thread(moto.start)
        try:
            with aws_environment(server):
                yield moto
        finally:
            moto.stop()
