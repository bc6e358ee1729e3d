"""A mixed fleet: the previous release's services and this checkout's, running at once against one database
and one NATS, as during a rolling upgrade (tests/test_mixed_fleet.py).

The previous release is built from its commit into a virtualenv of its own (`git archive` into a folder,
`uv sync --frozen` from that release's own uv.lock: its members editable, its pinned dependencies), from uv's
cache when it holds every package, else from the package index. Each process runs with its own interpreter
under one Supervisor, its output in a file of its own."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from vidjobs.cli.supervisor import GATEWAY_ONLY, Supervisor, log
from vidjobs.common.settings import PREFIX

ROOT = Path(__file__).resolve().parents[1]
# Said by uv when it cannot reach the package index (rather than when a package fails to build).
_OFFLINE = re.compile(r"(?i)(failed to fetch|error sending request|dns error|connect(ion)? (refused|error|timed out)|"
                      r"network|offline)")


class IndexOutOfReach(Exception):
    """The previous release's packages are neither in uv's cache nor reachable on the package index: the one
    reason, outside the repository's control, for the mixed-fleet test to skip (saying so)."""


@dataclass(frozen=True)
class Release:
    commit: str
    python: Path  # its virtualenv's interpreter
    source: Path  # the tree it is installed from (editable); its processes run from here
    settings: frozenset[str]  # the VIDJOBS_* settings it knows; it refuses to start on any other


def build_release(commit: str, home: Path) -> Release:
    """Install `commit` of this repository into `home` (a folder of its own). A commit this clone lacks, or a
    release that does not install, is an error: only an unreachable package index is IndexOutOfReach."""
    if shutil.which("git") is None:
        raise RuntimeError("git is not installed: the release is read from this repository's history")
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise RuntimeError(f"commit {commit} is not in this clone: fetch the full history (CI clones must not be "
                           "shallow) to run this test")
    source, venv = home / "src", home / "venv"
    source.mkdir(parents=True)
    archive = _git("archive", "--format=tar", commit)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(source, filter="data")
    if not (source / "uv.lock").exists():
        raise RuntimeError(f"{commit} has no uv.lock: releases from 0.1.0 on are uv workspaces, installed from it")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        raise RuntimeError("uv is not installed beside this interpreter nor on PATH")
    # The release's own lock, not this checkout's: its processes run with the dependencies it was released with.
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    install = [uv, "sync", "-q", "--frozen", "--no-default-groups", "-p", sys.executable, "--project", str(source)]
    if subprocess.run([*install, "--offline"], env=env, capture_output=True).returncode != 0:
        online = subprocess.run(install, env=env, capture_output=True, text=True)
        if online.returncode != 0:
            if _OFFLINE.search(online.stderr):
                raise IndexOutOfReach(f"the package index is out of reach: {online.stderr.strip()[-300:]}")
            raise RuntimeError(f"installing {commit} failed:\n{online.stderr}")
    python = venv / "bin" / "python"
    return Release(commit, python, source, _settings_of(python, source))


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


def _settings_of(python: Path, cwd: Path) -> frozenset[str]:
    code = ("import msgspec; from vidjobs.common.settings import Settings; "
            "print(' '.join(f.name for f in msgspec.structs.fields(Settings)))")
    out = subprocess.run([str(python), "-c", code], cwd=cwd, check=True, capture_output=True, text=True).stdout
    return frozenset(out.split())


@dataclass(frozen=True)
class Process:
    """One service process: the module it runs, with which interpreter, from where, and its settings."""

    module: str
    settings: Mapping[str, str]  # VIDJOBS_* variables
    python: Path = Path(sys.executable)
    cwd: Path = ROOT


def for_release(release: Release, module: str, settings: Mapping[str, str]) -> Process:
    """A process of the previous release, given only the settings it knows: a setting added since is not
    set for it, as a deployment keeps a new setting out of the old pods' configuration."""
    known = {f"{PREFIX}{name.upper()}" for name in release.settings}
    return Process(module, {k: v for k, v in settings.items() if k in known}, release.python, release.source)


class Fleet(Supervisor):
    """A Supervisor of named processes, each with its own interpreter, working folder and settings, its
    output in `log_dir/<name>.log`. `starts` counts the processes started per name (1: it never died)."""

    def __init__(self, processes: dict[str, Process], *, log_dir: Path):
        super().__init__({}, services={name: p.module for name, p in processes.items()})
        self.processes = processes
        self.log_dir = log_dir
        self.starts: dict[str, int] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def env(self, name: str) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
        env = {**inherited, **self.processes[name].settings}
        if not name.startswith("gateway"):
            env = {k: v for k, v in env.items() if k not in GATEWAY_ONLY}
        return env

    async def start(self, name: str) -> None:
        child, process = self.children[name], self.processes[name]
        child.wanted = True
        with (self.log_dir / f"{name}.log").open("ab") as out:  # a local file, opened once per process start
            child.proc = await asyncio.create_subprocess_exec(
                str(process.python), "-m", process.module, env=self.env(name), cwd=process.cwd,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            )
        child.started_at = time.monotonic()
        self.starts[name] = self.starts.get(name, 0) + 1
        log.info("started %s (pid %s)", name, child.proc.pid)
        child.watcher = asyncio.create_task(self._watch(child), name=f"watch-{name}")

    def ports(self, name: str) -> list[int]:
        """The ports the process listens on (a worker's /healthz, /readyz and /metrics: one free port)."""
        pid = self.pid(name)
        if pid is None:
            return []
        with contextlib.suppress(psutil.Error):
            return sorted(c.laddr.port for c in psutil.Process(pid).net_connections() if c.status == "LISTEN")
        return []

    async def wait_ready(self, session: aiohttp.ClientSession, name: str, *, within_s: float = 60) -> None:
        """Until the process answers 200 on /readyz (the fake provider, which has none: /healthz) at a port of
        its own."""
        path = "/healthz" if name == "fake-provider" else "/readyz"
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert self.pid(name) is not None or self.starts.get(name, 0) <= 1, f"{name} keeps dying: {self.tail(name)}"
            for port in self.ports(name):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                        if resp.status == 200:
                            return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{name} not ready within {within_s:.0f}s; its log ends:\n{self.tail(name)}")

    async def metrics(self, session: aiohttp.ClientSession, name: str) -> str:
        """The process's /metrics (a gateway's, on its API port, lists its own API and callback counters)."""
        for port in self.ports(name):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    if resp.status == 200:
                        return await resp.text()
        raise AssertionError(f"{name} serves no /metrics on {self.ports(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def counter_total(metrics: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include `labels`, from Prometheus' text format."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith(f"{name}{{") and not line.startswith(f"{name} "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
