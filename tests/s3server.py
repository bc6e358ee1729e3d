"""An S3-compatible server for tests: moto's server as a real subprocess on a free loopback port.

`moto_s3()` starts it and waits until it answers; `aws_environment()` points this process (and the service
processes the stack starts, which inherit os.environ) at it with throwaway credentials.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from vidjobs.cli.embedded import free_port

START_TIMEOUT_S = 30
TEST_BUCKET = "vidjobs-test"  # made once per session by the `s3_server` fixture in conftest.py


class MotoS3:
    def __init__(self, endpoint: str, proc: subprocess.Popen):
        self.endpoint = endpoint
        self.proc = proc

    def env(self) -> dict[str, str]:
        """AWS variables that point botocore at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        }

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200, answer.status


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_answering(server: MotoS3, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(server.endpoint):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"moto server did not start at {server.endpoint}: {log.read_text()[-2000:]}")
        time.sleep(0.05)


@contextlib.contextmanager
def moto_s3(workdir: Path) -> Iterator[MotoS3]:
    """A moto S3 server of its own, stopped (and reaped) on exit."""
    port = free_port()
    log = workdir / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
        )
    server = MotoS3(f"http://127.0.0.1:{port}", proc)
    try:
        _wait_until_answering(server, log)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def aws_environment(server: MotoS3) -> Iterator[None]:
    """Sets the AWS variables in os.environ for the block (children started meanwhile inherit them); drops
    any AWS_PROFILE or shared config that could send requests elsewhere."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        patch.setenv("AWS_CONFIG_FILE", os.devnull)
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        for name, value in server.env().items():
            patch.setenv(name, value)
        yield
