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

What is recorded, per process, is each entry into a first-party file (a file of a workspace member's source
tree or of the client library's; never one under .venv or site-packages, nor a compiled extension's, whose
functions carry relative names such as PyAV's av/error.py): a call of a function in it from a function in
another file, with the first-party files on the stack when it was made (its chain). A call within a file is not
an entry, nor is a coroutine resumed after an await. Entries are attributed to the asyncio task they run in (a
thread's, outside any task); a task's stack ends at its own coroutine, so the loop's runner (asyncio.run in a
service's main) is no one's caller. A task born while recording is a handler: a request (aiohttp runs each in a
task of its own) or a message (the bus handles each in a task of its own); tasks older than that are background
loops (pulls, the outbox relay, sweeps), which do this job's work too (the relay publishes its events) but also
their own, so their repeats are not counted.

A "revisit" (the raw count) is a file a handler enters again after entering another. `classify` sorts them:
leaf calls (an entry that enters no other file, or only files that never enter one), hub calls (one caller
entering a file again: control never left it), back-and-forth (a file entered from two or more files) and
cycles (a file entered while it is on the stack: a -> b -> a). The report totals back-and-forth files and
cycles per service, and names the pairs of files that call each other; `--tree` prints each handler's calls.

It reads the code from whatever environment runs it (`.venv/bin/python bench/walk.py` in another checkout walks
that checkout), so it runs against an older layout too: only `python -m vidjobs.cli up`, the `jobs` table and
the root pyproject.toml's map of source folders (uv workspace members, or setuptools' package-dir before them)
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
import tomllib
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
# The first-party source trees (each member's src/, the client's folder): the only files recorded.
SOURCES = tuple(os.path.realpath(p) + os.sep for p in os.environ.get("WALK_SOURCES", "").split(os.pathsep) if p)
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
        # A compiled extension's functions (PyAV's) carry a relative name, av/error.py: never first-party.
        path = os.path.realpath(filename) if filename and os.path.isabs(filename) else ""
        inside = (path.startswith(SOURCES) and path.startswith(ROOT)
                  and "/.venv/" not in path and "/site-packages/" not in path)
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
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    # A task's stack ends at its coroutine's frame: what lies below it is the loop and whatever runs the loop
    # (asyncio.run in a service's main), which is not this task's caller.
    outermost = getattr(task.get_coro(), "cr_frame", None) if task is not None else None
    caller, depth = (frame.f_back if frame is not outermost else None), 0
    chain = []  # the first-party files on the stack, innermost first, a file's calls within itself as one
    while caller is not None and depth < 300:
        above = _relative(caller.f_code.co_filename)
        if above and (not chain or chain[-1] != above):
            if not chain and above == path:
                return  # a call inside the file: the file was entered already
            chain.append(above)
        if caller is outermost:
            break
        caller, depth = caller.f_back, depth + 1
    chain.reverse()
    key = id(task) if task is not None else ("thread", threading.get_ident())
    unit = units.get(key)
    if unit is None:
        if task is not None:
            coro = task.get_coro()
            name = getattr(coro, "__qualname__", type(coro).__name__)
            kind = "background" if task in background else "handler"
        else:
            name, kind = threading.current_thread().name, "thread"
        unit = units[key] = {"name": name, "kind": kind, "entries": [], "task": task}
        order.append(unit)
    entries = unit["entries"]
    if not entries or entries[-1][0] != path or entries[-1][1] != chain:
        entries.append([path, chain])


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
                   "units": [{k: u[k] for k in ("name", "kind", "entries")} for u in order if u["entries"]]}, f)
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


@dataclass(frozen=True)
class Entry:
    """One entry into a file: the file, and the first-party files on the stack when it was entered (outermost
    first; a file's calls within itself as one; empty when a library or the event loop called it)."""

    path: str
    chain: tuple[str, ...]

    @property
    def caller(self) -> str:
        return self.chain[-1] if self.chain else FRAMEWORK

    @property
    def cycle(self) -> bool:
        """Entered again while still on the stack: a -> b -> a."""
        return self.path in self.chain


LEGEND = """\
each handler's entries into first-party files, in order; then its repeats sorted: leaf calls (entering no other
file, or only files that never enter one), hub calls (one caller entering a file again), BACK-AND-FORTH (a file
entered from two or more files) and CYCLES (a file entered while on the stack), each with the stack it was
entered from, [the file entered] last"""
FRAMEWORK = "(framework)"  # the caller of an entry no first-party code made: aiohttp, the bus's task, a thread


@dataclass
class Shape:
    """One handler's entries sorted by what a repeat means (see `classify`)."""

    leaf_calls: Counter[str]  # file -> its entries that entered no other file
    leaf_callers: dict[str, set[str]]  # file -> the files its leaf calls came from
    hub_calls: dict[str, tuple[str, int]]  # file -> (its one caller, entries) of a file entered 2+ times from it
    back_and_forth: dict[str, list[Entry]]  # file -> its entries, for a file entered from two or more callers
    cycles: list[Entry]  # entries into a file already on the stack


def children(entries: list[Entry]) -> list[list[int]]:
    """For each entry, the entries made while it ran, directly: an entry's parent is the latest earlier entry
    whose stack, with its file, is the entry's stack."""
    made: list[list[int]] = [[] for _ in entries]
    latest: dict[tuple[str, ...], int] = {}
    for i, entry in enumerate(entries):
        if (parent := latest.get(entry.chain)) is not None:
            made[parent].append(i)
        latest[(*entry.chain, entry.path)] = i
    return made


def classify(entries: list[Entry], leaves: frozenset[str] = frozenset()) -> Shape:
    """Tell back-and-forth from ordinary calls in one handler's entries, in the order they happened.

    An entry is a leaf call when, before it returns, it enters no other first-party file, or only `leaves`
    (files that enter none anywhere in the walk: a log line reading the request id is still a leaf call).
    Calling one twice is calling a function twice. Of the other entries, a file's entries all made by one caller
    file are hub calls (an orchestrator calling two functions of one module in turn: control never left it); a
    file entered by two or more caller files is back-and-forth (control went off and came back through another
    door). An entry into a file already on the stack is a cycle, listed on its own and not counted as a caller:
    a callback passed on purpose is one too, which the reader judges."""
    made = children(entries)
    leaf_calls: Counter[str] = Counter()
    leaf_callers: dict[str, set[str]] = {}
    callers: dict[str, list[Entry]] = {}
    for entry, below in zip(entries, made, strict=True):
        if entry.cycle:
            continue
        if all(entries[j].path in leaves for j in below):
            leaf_calls[entry.path] += 1
            leaf_callers.setdefault(entry.path, set()).add(entry.caller)
        else:
            callers.setdefault(entry.path, []).append(entry)
    hub_calls, back_and_forth = {}, {}
    for path, calls in callers.items():
        if len({e.caller for e in calls}) > 1:
            back_and_forth[path] = calls
        elif len(calls) > 1:
            hub_calls[path] = (calls[0].caller, len(calls))
    return Shape(leaf_calls, leaf_callers, hub_calls, back_and_forth, [e for e in entries if e.cycle])


@dataclass
class Unit:
    name: str
    kind: str  # handler, background or thread
    entries: list[Entry]  # each entry into a file from another file, in order

    @property
    def files(self) -> list[str]:
        """The files entered, in order, consecutive repeats collapsed."""
        return [e.path for i, e in enumerate(self.entries) if i == 0 or self.entries[i - 1].path != e.path]

    @property
    def revisits(self) -> dict[str, int]:
        """The files entered more than once, each time after another file: the raw count, before `classify`."""
        return {path: n for path, n in Counter(self.files).items() if n > 1}

    def shape(self, leaves: frozenset[str]) -> Shape:
        return classify(self.entries, leaves)

    @property
    def handling(self) -> bool:
        """Born while the walk recorded (a request, a message) or a thread's: the job's own handling, where a
        background loop (a pull, the relay, a sweep) repeats its iterations by design."""
        return self.kind != "background"


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

    def leaves(self) -> frozenset[str]:
        """The files that, anywhere in the walk, enter no other first-party file."""
        entered, entering = set(), set()
        for units in self.processes.values():
            for unit in units:
                entered |= {e.path for e in unit.entries}
                entering |= {e.path for e, below in zip(unit.entries, children(unit.entries), strict=True) if below}
        return frozenset(entered - entering)

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


def source_trees(root: Path) -> list[Path]:
    """The first-party source trees of the checkout: each workspace member's module root (src/, or the
    client's own folder), or, in the layout before the workspace, the folders setuptools maps packages to."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    members = project.get("tool", {}).get("uv", {}).get("workspace", {}).get("members")
    if members:
        trees = []
        for folder in members:
            member = tomllib.loads((root / folder / "pyproject.toml").read_text())
            module_root = member.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-root", "src")
            trees.append(root / folder / module_root)
        return trees
    return [root / folder for folder in project["tool"]["setuptools"]["package-dir"].values()]


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
               "WALK_SOURCES": os.pathsep.join(str(tree) for tree in source_trees(root)),
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
        result.processes[name] = [
            Unit(u["name"], u["kind"], [Entry(short(p), tuple(short(c) for c in chain)) for p, chain in u["entries"]])
            for u in dump["units"]]
    return result


def _wrapped(files: list[str] | tuple[str, ...], indent: str, width: int = 118) -> list[str]:
    lines, line = [], indent
    for i, path in enumerate(files):
        piece = path if i == 0 else f" > {path}"
        if len(line) + len(piece) > width and line.strip():
            lines.append(line)
            line = indent + "  " + piece.lstrip()
        else:
            line += piece
    return [*lines, line]


def _filled(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, 118, initial_indent=indent, subsequent_indent=indent + "  ")


def _leaf_calls(shape: Shape) -> str:
    """Each file's leaf calls counted, and where a file's came from several files, from which."""
    out = []
    for path, n in sorted(shape.leaf_calls.items()):
        froms = shape.leaf_callers[path]
        out.append((f"{path} x{n}" if n > 1 else path) + (f" (from {', '.join(sorted(froms))})" if len(froms) > 1
                                                           else ""))
    return ", ".join(out)


def _shape_lines(shape: Shape) -> list[str]:
    out = []
    if shape.leaf_calls:
        out += _filled(f"leaf calls ({sum(shape.leaf_calls.values())}): {_leaf_calls(shape)}", "    ")
    if shape.hub_calls:
        hubs = ", ".join(f"{path} x{n} from {caller}" for path, (caller, n) in sorted(shape.hub_calls.items()))
        out += _filled(f"hub calls: {hubs}", "    ")
    for path, made in sorted(shape.back_and_forth.items()):
        out.append(f"    BACK-AND-FORTH {path}, entered from {len({e.caller for e in made})} files:")
        for entry in made:
            out += _wrapped([*entry.chain, f"[{entry.path}]"], "      ")
    for entry in shape.cycles:
        out.append(f"    CYCLE {entry.path}, entered from {entry.caller} while on the stack:")
        out += _wrapped([*entry.chain, f"[{entry.path}]"], "      ")
    return out


@dataclass
class Tally:
    """A service's handling, summed: the distinct files that go back and forth, and the cycles (a file
    re-entered while on the stack, by the caller that re-entered it)."""

    back_and_forth: set[str] = field(default_factory=set)
    cycles: set[tuple[str, str]] = field(default_factory=set)
    calls: set[tuple[str, str]] = field(default_factory=set)  # (caller file, file) of every entry

    def add(self, unit: Unit, leaves: frozenset[str]) -> None:
        shape = unit.shape(leaves)
        self.back_and_forth |= set(shape.back_and_forth)
        self.cycles |= {(e.path, e.caller) for e in shape.cycles}
        self.calls |= {(e.caller, e.path) for e in unit.entries}

    @property
    def both_ways(self) -> set[tuple[str, str]]:
        """Pairs of files each calling the other in this service's handling (not necessarily nested)."""
        return {(a, b) for a, b in self.calls if a < b and (b, a) in self.calls}

    def line(self) -> str:
        files = ", ".join(sorted(self.back_and_forth)) or "none"
        cycles = ", ".join(f"{caller} -> {path}" for path, caller in sorted(self.cycles)) or "none"
        mutual = ", ".join(f"{a} <-> {b}" for a, b in sorted(self.both_ways)) or "none"
        return (f"{len(self.back_and_forth)} back-and-forth ({files}); {len(self.cycles)} cycles ({cycles}); "
                f"calling each other: {mutual}")


def tally(units: list[Unit], leaves: frozenset[str]) -> Tally:
    found = Tally()
    for unit in units:
        if unit.handling:
            found.add(unit, leaves)
    return found


def tree(result: Walk) -> str:
    """Every handler's entries as a call tree: each file indented under the one it was entered from."""
    out = []
    for name in SERVICES:
        for unit in result.processes.get(name, []):
            if unit.handling and len(unit.entries) > 1:
                out.append(f"== {name} [{unit.kind}] {unit.name}")
                above: list[str] = []  # the file last printed at each depth
                for e in unit.entries:
                    depth = len(e.chain)
                    # An entry whose caller is not the line it sits under (a callback run on a context's exit)
                    # names its caller.
                    odd = depth and (len(above) < depth or above[depth - 1] != e.caller)
                    out.append("  " * (1 + depth) + e.path + (f"  (from {e.caller})" if odd else ""))
                    above = [*(above + [""] * depth)[:depth], e.path]
    return "\n".join(out)


def report(result: Walk) -> str:
    out = [f"one job, POST /v1/jobs -> completed (fake/default, callbacks), in {result.seconds:.1f}s; "
           f"code from {result.source}",
           LEGEND]
    tallies, leaves = {}, result.leaves()
    for name in SERVICES:
        units = result.processes.get(name, [])
        tallies[name] = tally(units, leaves)
        out.append(f"\n== {name}: {len(result.files(name))} distinct first-party files "
                   f"({len(result.files(name, 'handler'))} in handlers); {sum(u.kind == 'handler' for u in units)} "
                   f"handlers, {sum(bool(u.revisits) for u in units if u.handling)} with revisits")
        alike = Counter((u.name, u.kind, tuple(u.entries)) for u in units)
        for unit in units:
            times = alike.pop((unit.name, unit.kind, tuple(unit.entries)), 0)
            if not times:
                continue  # printed with the first of its kind
            count = f" (x{times})" if times > 1 else ""
            loop = "; a loop, its repeats not counted below" if not unit.handling else ""
            out.append(f"  [{unit.kind}] {unit.name}{count}: {len(unit.entries)} entries, "
                       f"{len(set(unit.files))} files{loop}")
            out += _wrapped(unit.files, "    ")
            if unit.revisits:
                out += _shape_lines(unit.shape(leaves))
        out += _filled(f"-- {name}: {tallies[name].line()}", "  ")
    everything, handled = result.files(), result.files(kind="handler")
    out.append(f"\ntotal: {len(everything)} distinct first-party files over {len(result.processes)} processes "
               f"({len(handled)} entered by handlers); handlers with revisits: "
               f"{sum(bool(u.revisits) for units in result.processes.values() for u in units if u.handling)}")
    for name in SERVICES:
        out += _filled(f"{name}: {tallies[name].line()}", "  ")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--database-url", help="a migrated-or-empty PostgreSQL database (default: embedded)")
    parser.add_argument("--nats-url", help="a nats-server with JetStream (default: embedded)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for each step")
    parser.add_argument("--grace", type=float, default=1.0, help="seconds recorded after the job completes")
    parser.add_argument("--tree", action="store_true", help="print each handler's call tree after the report")
    args = parser.parse_args()
    result = asyncio.run(walk(database_url=args.database_url, nats_url=args.nats_url, timeout_s=args.timeout,
                              grace_s=args.grace))
    print(report(result))
    if args.tree:
        print("\n" + tree(result))


if __name__ == "__main__":
    main()
