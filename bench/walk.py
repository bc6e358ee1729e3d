"""One job's walk through the code: which first-party files each process enters, in order, to take one job from
POST /v1/jobs to completed (the fake provider, with callbacks), and which it enters again while handling one
message or request.

    python bench/walk.py                      # its own embedded stack (`vidjobs up` on a fresh data directory)
    python bench/walk.py --database-url URL --nats-url URL

It starts the stack as `vidjobs up` does, with a tracer in every Python process: a `sitecustomize` module put on
PYTHONPATH that installs a profile hook (sys.setprofile, and threading.setprofile for threads started later).
The hook records nothing until the walk switches it on (a flag file, watched by a thread of the tracer): the
stack is started and settled first. Then one job is created and the walk waits, reading the database, until it
is completed, and a grace period more for the work that follows the commit (acks, published events).

What is recorded, per process, is each entry into a first-party file (under the checkout, outside its
virtualenv): a call of a function in it from a function in another file. A call within a file is not an entry,
nor is a coroutine resumed after an await. Entries are attributed to the asyncio task they run in (a thread's,
outside any task) and kept in order, consecutive repeats collapsed. A task born while recording is a handler: a
request (aiohttp runs each in a task of its own) or a message (the bus handles each in a task of its own);
tasks older than that are background loops (pulls, the outbox relay, sweeps), which do this job's work too
(the relay publishes its events) but also their own. A "revisit" is a file a handler enters again after
entering another; "re-entered while on the stack" marks a file entered from code it called (a -> b -> a).

It reads the code from whatever environment runs it (`.venv/bin/python bench/walk.py` in another checkout walks
that checkout), so it runs against an older layout too: only `python -m vidjobs.cli up` and the `jobs` table
are assumed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg

SERVICES = ("gateway", "submitter", "poller", "media", "reaper")

# The tracer, written as sitecustomize.py into a folder of its own on PYTHONPATH. Every Python process of the
# stack imports it at start; it does nothing unless WALK_TRACE_DIR is set.
TRACER = r'''
import asyncio, dis, json, os, sys, threading, time, weakref

TRACE_DIR = os.environ.get("WALK_TRACE_DIR")
ROOT = os.path.realpath(os.environ.get("WALK_ROOT", "/nonexistent")) + os.sep
GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator
enabled = False
background = weakref.WeakSet()  # the tasks alive when recording began (by identity: an id is reused once freed)
units = {}
order = []
relative = {}
first_resume = {}


def _relative(filename):
    found = relative.get(filename)
    if found is None:
        path = os.path.realpath(filename) if filename and not filename.startswith("<") else ""
        inside = path.startswith(ROOT) and "/.venv/" not in path and "/site-packages/" not in path
        found = relative[filename] = path[len(ROOT):] if inside else ""
    return found


def _resume_offset(code):
    offset = first_resume.get(code)
    if offset is None:
        offset = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
        first_resume[code] = offset
    return offset


def _profile(frame, event, arg):
    if event != "call" or not enabled:
        return
    code = frame.f_code
    path = _relative(code.co_filename)
    if not path:
        return
    if code.co_flags & GENERATOR_LIKE and frame.f_lasti > _resume_offset(code):
        return  # a coroutine or generator resumed, not entered
    caller, on_stack, depth = frame.f_back, False, 0
    calling = ""  # the file of the nearest first-party caller
    while caller is not None and depth < 300:
        above = _relative(caller.f_code.co_filename)
        if above and not calling:
            calling = above
            if calling == path:
                return  # a call inside the file: the file was entered already
        elif above == path:
            on_stack = True  # entered again from code it called: a cycle between files
            break
        caller, depth = caller.f_back, depth + 1
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    key = id(task) if task is not None else ("thread", threading.get_ident())
    unit = units.get(key)
    if unit is None:
        if task is not None:
            coro = task.get_coro()
            name = getattr(coro, "__qualname__", type(coro).__name__)
            kind = "background" if task in background else "handler"
        else:
            name, kind = threading.current_thread().name, "thread"
        unit = units[key] = {"name": name, "kind": kind, "files": [], "task": task}
        order.append(unit)
    files = unit["files"]
    if not files or files[-1][0] != path:
        files.append([path, on_stack])


def _alive_tasks():
    tasks = getattr(asyncio.tasks, "_all_tasks", ())  # Python 3.11: every task of every loop, weakly
    for _ in range(20):
        try:
            return list(tasks)
        except RuntimeError:  # changed while read, from the loop's thread
            time.sleep(0.001)
    return []


def _dump():
    out = os.path.join(TRACE_DIR, f"{os.getpid()}.json")
    with open(out + ".part", "w") as f:
        json.dump({"argv": list(getattr(sys, "orig_argv", sys.argv)),
                   "units": [{k: u[k] for k in ("name", "kind", "files")} for u in order if u["files"]]}, f)
    os.replace(out + ".part", out)


def _watch():
    global enabled
    flag = os.path.join(TRACE_DIR, "on")
    while not os.path.exists(flag):
        time.sleep(0.02)
    background.update(_alive_tasks())
    enabled = True
    while os.path.exists(flag):
        time.sleep(0.02)
    enabled = False
    _dump()


if TRACE_DIR:
    with open(os.path.join(TRACE_DIR, f"{os.getpid()}.proc"), "w") as f:
        json.dump(list(getattr(sys, "orig_argv", sys.argv)), f)
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    threading.Thread(target=_watch, name="walk-tracer", daemon=True).start()
'''


@dataclass
class Unit:
    name: str
    kind: str  # handler, background or thread
    files: list[str]  # each entry into a file from another file, consecutive repeats collapsed
    cycles: set[str]  # files entered again while still on the stack (a -> b -> a)

    @property
    def revisits(self) -> dict[str, int]:
        """For a handler, the files entered more than once, each time after another file."""
        return {path: n for path, n in Counter(self.files).items() if n > 1} if self.kind == "handler" else {}


def short(path: str) -> str:
    """A file as both layouts can be compared by: `gateway/routes_jobs.py` for services/gateway/routes_jobs.py
    (the old layout) and services/gateway/src/vidjobs/gateway/routes_jobs.py (the workspace)."""
    path = re.sub(r"^(?:(?:libs|services)/)?([a-z_]+)/src/vidjobs/\1/", r"\1/", path)
    return re.sub(r"^(?:libs|services)/", "", path)


@dataclass
class Walk:
    source: Path
    seconds: float  # POST to completed
    processes: dict[str, list[Unit]] = field(default_factory=dict)

    def files(self, service: str | None = None, kind: str | None = None) -> set[str]:
        names = [service] if service else list(self.processes)
        return {path for name in names for unit in self.processes.get(name, [])
                if kind in (None, unit.kind) for path in unit.files}


def service_of(argv: list[str]) -> str | None:
    """The service a traced process runs: `python -m vidjobs.<service>`."""
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        if module.startswith("vidjobs.") and module.split(".")[1] in SERVICES:
            return module.split(".")[1]
    return None


def source_root() -> Path:
    """The checkout whose code this environment runs: the folder above the installed vidjobs.common that holds
    the project's pyproject.toml and libs/."""
    import vidjobs.common

    here = Path(vidjobs.common.__file__).resolve()
    return next(p for p in here.parents if (p / "pyproject.toml").exists() and (p / "libs").is_dir())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_database_url(pgdata: Path) -> str:
    """The URL of the PostgreSQL `vidjobs up` started under its data directory, from postmaster.pid (its 4th
    and 5th lines are the port and the socket's folder)."""
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    return f"postgresql://postgres:@/postgres?host={lines[4].strip()}&port={lines[3].strip()}"


async def _ready_line(stdout: asyncio.StreamReader, timeout_s: float) -> tuple[str, str]:
    async def read() -> tuple[str, str]:
        while line := (await stdout.readline()).decode():
            if found := re.search(r"vidjobs ready: (\S+) api-key=(\S+)", line):
                return found.group(1), found.group(2)
        raise RuntimeError("`vidjobs up` stopped before it was ready (its log is in the walk's output above)")
    return await asyncio.wait_for(read(), timeout_s)


async def _wait_for(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (result := await predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")
        await asyncio.sleep(0.1)
    return result


async def _one_job(url: str, key: str, database_url: str, timeout_s: float) -> float:
    body = {"model": "fake/default", "prompt": "a red fox in snow", "duration_s": 1}
    started = time.monotonic()
    # A connection of its own, closed after: the request is the only one on it.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with session.post(f"{url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
            created = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"POST /v1/jobs answered {resp.status}: {created}")
    conn = await asyncpg.connect(database_url)
    try:
        async def finished() -> str | None:
            status = await conn.fetchval("SELECT status::text FROM jobs WHERE id = $1", created["id"])
            return status if status in ("completed", "failed", "canceled", "expired") else None
        status = await _wait_for(finished, timeout_s, f"job {created['id']} to finish")
    finally:
        await conn.close()
    if status != "completed":
        raise RuntimeError(f"job {created['id']} ended {status}, not completed")
    return time.monotonic() - started


async def walk(*, database_url: str | None = None, nats_url: str | None = None, timeout_s: float = 120,
               settle_s: float = 2.0, grace_s: float = 1.0) -> Walk:
    root = source_root()
    with tempfile.TemporaryDirectory(prefix="walk-") as scratch:
        tmp = Path(scratch)
        (tmp / "tracer").mkdir()
        (tmp / "tracer" / "sitecustomize.py").write_text(TRACER)
        traces = tmp / "traces"
        traces.mkdir()
        env = {**os.environ, "WALK_TRACE_DIR": str(traces), "WALK_ROOT": str(root),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp / "tracer"), os.environ.get("PYTHONPATH")]))}
        env |= {"VIDJOBS_DATABASE_URL": database_url} if database_url else {}
        env |= {"VIDJOBS_NATS_URL": nats_url} if nats_url else {}
        up = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vidjobs.cli", "up", "--data-dir", str(tmp / "data"), "--port", str(free_port()),
            env=env, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        try:
            assert up.stdout is not None
            url, key = await _ready_line(up.stdout, timeout_s)
            database_url = database_url or embedded_database_url(tmp / "data" / "postgres")

            async def all_started() -> bool:
                argvs = [json.loads(p.read_text()) for p in traces.glob("*.proc")]
                return set(SERVICES) <= {service_of(a) for a in argvs}
            await _wait_for(all_started, timeout_s, "every service to start")
            await asyncio.sleep(settle_s)  # startup's own work (streams, consumers, first sweeps) ends

            (traces / "on").touch()
            await asyncio.sleep(0.2)  # every tracer has seen the flag
            seconds = await _one_job(url, key, database_url, timeout_s)
            await asyncio.sleep(grace_s)
            (traces / "on").unlink()

            async def all_dumped() -> list[dict]:
                dumps = [json.loads(p.read_text()) for p in traces.glob("*.json")]
                named = [d for d in dumps if service_of(d["argv"])]
                return named if len(named) >= len(SERVICES) else []
            dumps = await _wait_for(all_dumped, 30, "every tracer's record")
        finally:
            with contextlib.suppress(ProcessLookupError):
                up.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(up.wait(), 60)
            except TimeoutError:
                os.killpg(up.pid, signal.SIGKILL)
                await up.wait()
    result = Walk(source=root, seconds=seconds)
    for dump in dumps:
        name = service_of(dump["argv"])
        assert name is not None
        result.processes[name] = [Unit(u["name"], u["kind"], [short(p) for p, _ in u["files"]],
                                       {short(p) for p, cycle in u["files"] if cycle}) for u in dump["units"]]
    return result


def _wrapped(files: list[str], indent: str, width: int = 118) -> list[str]:
    lines, line = [], indent
    for i, path in enumerate(files):
        piece = path if i == 0 else f" > {path}"
        if len(line) + len(piece) > width and line.strip():
            lines.append(line)
            line = indent + "  " + piece.lstrip()
        else:
            line += piece
    return [*lines, line]


def report(result: Walk) -> str:
    out = [f"one job, POST /v1/jobs -> completed (fake/default, callbacks), in {result.seconds:.1f}s; "
           f"code from {result.source}"]
    for name in SERVICES:
        units = result.processes.get(name, [])
        revisited = [u for u in units if u.revisits]
        out.append(f"\n== {name}: {len(result.files(name))} distinct first-party files "
                   f"({len(result.files(name, 'handler'))} in handlers); {sum(u.kind == 'handler' for u in units)} "
                   f"handlers, {len(revisited)} with revisits")
        alike = Counter((u.name, u.kind, tuple(u.files)) for u in units)
        for unit in units:
            times = alike.pop((unit.name, unit.kind, tuple(unit.files)), 0)
            if not times:
                continue  # printed with the first of its kind
            count = f" (x{times})" if times > 1 else ""
            out.append(f"  [{unit.kind}] {unit.name}{count}: {len(unit.files)} entries, {len(set(unit.files))} files")
            out += _wrapped(unit.files, "    ")
            if unit.revisits:
                counted = ", ".join(f"{p} x{n}" for p, n in sorted(unit.revisits.items()))
                out.append(textwrap.fill(f"revisits: {counted}", 118, initial_indent="    ",
                                         subsequent_indent="      "))
            if unit.cycles and unit.kind == "handler":
                out.append("    re-entered while on the stack: " + ", ".join(sorted(unit.cycles)))
    everything, handled = result.files(), result.files(kind="handler")
    out.append(f"\ntotal: {len(everything)} distinct first-party files over {len(result.processes)} processes "
               f"({len(handled)} entered by handlers); handlers with revisits: "
               f"{sum(bool(u.revisits) for units in result.processes.values() for u in units)}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--database-url", help="a migrated-or-empty PostgreSQL database (default: embedded)")
    parser.add_argument("--nats-url", help="a nats-server with JetStream (default: embedded)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for each step")
    parser.add_argument("--grace", type=float, default=1.0, help="seconds recorded after the job completes")
    args = parser.parse_args()
    result = asyncio.run(walk(database_url=args.database_url, nats_url=args.nats_url, timeout_s=args.timeout,
                              grace_s=args.grace))
    print(report(result))


if __name__ == "__main__":
    main()
