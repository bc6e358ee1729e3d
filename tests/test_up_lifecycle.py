"""`vidjobs up` ends as a person ends it and leaves nothing behind: Ctrl-C (a SIGINT to the terminal's whole
process group), SIGTERM to it alone, Ctrl-C before it is ready, and a SIGKILL whose leftovers the next start on
the same data directory finds and deals with. Real processes throughout: the command, its services, the fake
provider, nats-server and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import psutil
import pytest

from tests.support import wait_until
from vidjobs.cli.embedded import EmbeddedPostgres, free_port
from vidjobs.common.errors import ConfigError

READY = re.compile(r"vidjobs ready: (\S+) api-key=(\S+)")


class Up:
    """One `vidjobs up` in a session of its own, as a shell runs a foreground command: a signal to its
    process group is what Ctrl-C in the terminal sends."""

    def __init__(self, proc: asyncio.subprocess.Process, err_path: Path):
        self.proc = proc
        self.err_path = err_path

    @classmethod
    async def start(cls, data_dir: Path, port: int, err_path: Path, *, sigint_ignored: bool = False) -> Up:
        """`sigint_ignored`: started as a script starts a command in the background, with SIGINT ignored, which
        a process inherits (and keeps across exec)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
        env["VIDJOBS_DATA_DIR"] = str(data_dir)
        disposition = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
        with err_path.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vidjobs.cli", "up", "--port", str(port), env=env,
                stdout=asyncio.subprocess.PIPE, stderr=err, stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
            )
        return cls(proc, err_path)

    async def ready(self) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(180):
            while True:
                line = (await self.proc.stdout.readline()).decode()
                assert line, f"`vidjobs up` exited ({await self.proc.wait()}) before it was ready: {self.stderr()}"
                if match := READY.search(line):
                    return match.group(1)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    async def ended(self) -> int:
        async with asyncio.timeout(90):
            return await self.proc.wait()

    def kill_group(self) -> None:
        """What is left in the command's own session, for a test that failed half way."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def processes_of(up_pid: int, data_dir: Path) -> set[psutil.Process]:
    """Every process a `vidjobs up` runs: its descendants, and the servers that name its data directory on
    their command line (PostgreSQL detaches from its starter) with their own children."""
    found: set[psutil.Process] = set()
    try:
        found.update(psutil.Process(up_pid).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for proc in psutil.process_iter(["cmdline"]):
        if str(data_dir) in " ".join(proc.info["cmdline"] or ()):
            found.add(proc)
            try:
                found.update(proc.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    return {p for p in found if p.pid != os.getpid()}


def describe(procs: set[psutil.Process]) -> list[str]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    return sorted(alive)


async def all_gone(procs: set[psutil.Process], within: float = 20) -> list[str]:
    """The processes of `procs` still running after `within` seconds (none, when all is well)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    for _ in range(int(within / 0.2) + 1):
        if not (left := describe(procs)) or loop.time() > deadline:
            return left
        await asyncio.sleep(0.2)
    return describe(procs)


def the_whole_stack(procs: set[psutil.Process]) -> bool:
    lines = " ".join(describe(procs))
    return all(part in lines for part in ("nats-server", "postgres", "vidjobs.gateway", "vidjobs.fakeprovider",
                                          "vidjobs.reaper"))


async def running(up: Up, data_dir: Path) -> set[psutil.Process]:
    await up.ready()
    return await wait_until(lambda: _stack(up, data_dir), within=30, what="every process of the stack")


async def _stack(up: Up, data_dir: Path) -> set[psutil.Process] | None:
    procs = processes_of(up.proc.pid, data_dir)
    return procs if the_whole_stack(procs) else None


def _ctrl_c(up: Up) -> None:
    os.killpg(up.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group


def _sigterm(up: Up) -> None:
    up.proc.send_signal(signal.SIGTERM)  # `kill PID`, or a process manager stopping the command alone


@pytest.mark.parametrize("stop", [_ctrl_c, _sigterm], ids=["ctrl-c", "sigterm"])
async def test_a_stop_ends_every_process_without_a_traceback(tmp_path, stop):
    data = tmp_path / "state"
    up = await Up.start(data, free_port(), tmp_path / "up.err")
    try:
        procs = await running(up, data)
        stop(up)
        code = await up.ended()
        left = await all_gone(procs)
    finally:
        up.kill_group()
    err = up.stderr()
    assert code == 0, err
    assert "Traceback" not in err, err
    assert "vidjobs stopped" in err
    assert not left, left


async def _ctrl_c_while_postgres_starts(up: Up, data: Path, *, after_s: float) -> tuple[int, list[str]]:
    """Ctrl-C `after_s` into the embedded PostgreSQL's start: (exit status, its processes still running)."""
    try:
        await wait_until(lambda: _says(up, "starting embedded PostgreSQL"), within=60, what="PostgreSQL starting")
        await asyncio.sleep(after_s)
        procs = processes_of(up.proc.pid, data)
        os.killpg(up.proc.pid, signal.SIGINT)
        code = await up.ended()
        procs |= processes_of(up.proc.pid, data)
        return code, await all_gone(procs)
    finally:
        up.kill_group()


async def test_ctrl_c_before_ready_stops_cleanly_and_the_next_start_works(tmp_path):
    data = tmp_path / "state"
    port = free_port()
    up = await Up.start(data, port, tmp_path / "up.err")
    # While the embedded PostgreSQL is being initialised: the slowest, most fragile part of a first start.
    code, left = await _ctrl_c_while_postgres_starts(up, data, after_s=1.0)
    err = up.stderr()
    assert "vidjobs ready" not in err
    assert code == 0, err
    assert "Traceback" not in err, err
    assert not left, left

    # Once services run, but before the gateway answers ready.
    again = await Up.start(data, port, tmp_path / "again.err")
    try:
        try:
            await wait_until(lambda: _has(again, data, "vidjobs.gateway"), within=120, what="the gateway to start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{again.stderr()}\n{describe(processes_of(again.proc.pid, data))}") from None
        procs = processes_of(again.proc.pid, data)
        os.killpg(again.proc.pid, signal.SIGINT)
        code = await again.ended()
        left = await all_gone(procs)
    finally:
        again.kill_group()
    assert code == 0, again.stderr()
    assert "Traceback" not in again.stderr(), again.stderr()
    assert not left, left

    # Nothing either interruption left stops a full start.
    third = await Up.start(data, port, tmp_path / "third.err")
    try:
        procs = await running(third, data)
        third.proc.send_signal(signal.SIGINT)
        assert await third.ended() == 0, third.stderr()
        assert not await all_gone(procs)
    finally:
        third.kill_group()


async def test_a_killed_up_leaves_nothing_the_next_start_does_not_deal_with(tmp_path):
    data = tmp_path / "state"
    port = free_port()
    first = await Up.start(data, port, tmp_path / "first.err")
    try:
        first_procs = await running(first, data)
        first.proc.kill()  # SIGKILL to the command alone: no handler runs, nothing is stopped by it
        # Its exit, not its pipes' end: processes it left may hold its stdout open.
        await wait_until(lambda: _exited(first), within=30, what="the killed command's exit")
        await asyncio.sleep(1.0)
        print("left by the killed `vidjobs up`:", *describe(first_procs), sep="\n  ")

        second = await Up.start(data, port, tmp_path / "second.err")
        try:
            second_procs = await running(second, data)
            assert the_whole_stack(second_procs - first_procs) or _reused_postgres(second_procs, first_procs)
            second.proc.send_signal(signal.SIGINT)
            code = await second.ended()
            left = await all_gone(first_procs | second_procs)
        finally:
            second.kill_group()
    finally:
        first.kill_group()
    assert code == 0, second.stderr()
    assert "Traceback" not in second.stderr(), second.stderr()
    assert not left, left


def _reused_postgres(second: set[psutil.Process], first: set[psutil.Process]) -> bool:
    """Every service new in the second run, with PostgreSQL the one the first run left (reused, not doubled)."""
    fresh = " ".join(describe(second - first))
    kept = " ".join(describe(second & first))
    services = ("nats-server", "vidjobs.gateway", "vidjobs.fakeprovider", "vidjobs.reaper")
    return all(s in fresh for s in services) and "postgres" in kept and not any(s in kept for s in services)


async def _exited(up: Up) -> bool:
    return up.proc.returncode is not None


async def _says(up: Up, text: str) -> bool:
    return text in up.stderr()


async def _has(up: Up, data: Path, text: str) -> bool:
    return any(text in line for line in describe(processes_of(up.proc.pid, data)))


def _stray(*argv: str) -> subprocess.Popen[bytes]:
    """A process as a killed run's service would be on a system without PR_SET_PDEATHSIG: still running, in a
    session of its own, not stopped by anything but whoever finds it."""
    return subprocess.Popen(list(argv), start_new_session=True)


def test_the_next_start_stops_what_a_killed_run_recorded_and_nothing_else(tmp_path):
    from vidjobs.cli.processes import Recorded, record
    from vidjobs.cli.runstate import RunRecord, RunState

    program = [sys.executable, "-c", "import time; time.sleep(600)"]
    service, bystander = _stray(*program), _stray(*program)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        service_record, bystander_now = record(service.pid), record(bystander.pid)
        assert service_record is not None and bystander_now is not None
        # The bystander holds a pid the record names, but it is not the process recorded (another start time).
        earlier = RunState(Recorded(gone.pid, "python -m vidjobs.cli up", "1"), {
            "gateway": service_record,
            "media": Recorded(bystander.pid, bystander_now.command, str(int(bystander_now.started) - 1)),
        })
        (tmp_path / "up.json").write_bytes(msgspec.json.encode(earlier))

        run = RunRecord.claim(tmp_path)

        assert service.wait(timeout=15) == -signal.SIGTERM
        assert bystander.poll() is None
        assert run.state.supervisor.pid == os.getpid()
        # While this run holds the directory, another start on it is refused.
        with pytest.raises(ConfigError, match="already running"):
            RunRecord.claim(tmp_path)
        run.release()
        RunRecord.claim(tmp_path).release()
    finally:
        for proc in (service, bystander):
            proc.kill()
            proc.wait()


async def test_ctrl_c_stops_a_start_even_when_sigint_was_ignored_by_whoever_started_it(tmp_path):
    data = tmp_path / "state"
    up = await Up.start(data, free_port(), tmp_path / "up.err", sigint_ignored=True)
    code, left = await _ctrl_c_while_postgres_starts(up, data, after_s=0.0)
    err = up.stderr()
    assert (code, "Traceback" in err, left) == (0, False, []), err
    assert "vidjobs stopped" in err


# What initdb has made of a data directory when it is cut short (SIGKILLed, as subprocess.run does to it when the
# process running it is interrupted) before it wrote PG_VERSION: its subdirectories and nothing else.
INITDB_CUT_SHORT = ["base", "global", "pg_wal", "pg_xact", "pg_commit_ts", "pg_multixact", "pg_tblspc"]


def _stop_quietly(server: EmbeddedPostgres) -> None:
    server.stop()


def test_a_first_initialisation_cut_short_is_begun_again(tmp_path: Path) -> None:
    data = tmp_path / "postgres"
    for name in INITDB_CUT_SHORT:
        (data / name).mkdir(parents=True)
    (data / "base" / "1").mkdir()

    server = EmbeddedPostgres(data).start()
    try:
        out = subprocess.run([*_psql(server), "-Atc", "SELECT 1"], capture_output=True, text=True, timeout=60)
    finally:
        _stop_quietly(server)
    assert out.stdout.strip() == "1", out


def test_a_data_directory_holding_files_postgres_did_not_make_is_refused_untouched(tmp_path: Path) -> None:
    data = tmp_path / "postgres"
    (data / "base").mkdir(parents=True)
    (data / "notes.txt").write_text("mine")

    with pytest.raises(ConfigError) as refused:
        EmbeddedPostgres(data).start()
    assert "notes.txt" in str(refused.value) and str(data) in str(refused.value)
    assert (data / "notes.txt").read_text() == "mine" and (data / "base").is_dir()


def _psql(server: EmbeddedPostgres) -> list[str]:
    from pgserver._commands import POSTGRES_BIN_PATH

    return [str(POSTGRES_BIN_PATH / "psql"), server.url]


_HOLD_LOCK = """
import sys, time
import fasteners
lock = fasteners.InterProcessLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""

_START_AND_STOP = """
import sys
from pathlib import Path
from vidjobs.cli.embedded import EmbeddedPostgres
server = EmbeddedPostgres(Path(sys.argv[1])).start()
print("started", flush=True)
server.stop()
"""


def test_a_start_stuck_on_another_data_directory_does_not_hold_this_one_up(tmp_path: Path) -> None:
    """pgserver's one lock per user, held by another stack's start that never ends (a stalled disk, a stopped
    process), does not keep this data directory's PostgreSQL from starting."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    users_lock = runtime / "python_PostgresServer" / ".lockfile"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(users_lock)], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
        try:
            out = subprocess.run([sys.executable, "-c", _START_AND_STOP, str(tmp_path / "stack" / "postgres")],
                                 env=env, capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("the start waited on another data directory's lock")
    finally:
        holder.kill()
        holder.wait()
    assert (out.returncode, out.stdout) == (0, "started\n"), out.stderr
