"""Event streams (`GET /v1/jobs/{id}/stream`) at launch-day numbers: what they cost the gateway and the database,
and whether every one of them sees its job to the end.

    python bench/streams.py                                   # 1,000 streams, 100 accounts x 50 jobs, one gateway
    python bench/streams.py --gateways 1,2                    # the same on one gateway process, then on two
    python bench/streams.py --accounts 200 --streams 10000    # 10,000 streams (50 per account: a key's limit)
    python bench/streams.py --no-statements                   # without PostgreSQL's statement log (see below)

Each configuration (`--gateways`, comma-separated: 1 or 2 gateway processes) runs on an embedded stack of its own,
built as `vidjobs up` builds it (bench/lifecycle.py's `own_stack`: the fake provider without caps). `vidjobs up`
runs one gateway process on one port; with 2, a second gateway process with the same settings listens on a port of
its own, and the streams alternate between the two addresses, as a balancer would spread them. The benchmark uses
only the public HTTP API, PostgreSQL's tables and statistics, and the kernel's process accounting (bench/cpu.py),
so it measures any version of the stream's internals alike.

1. Idle streams. `--idle-streams` streams are opened on jobs that wait and never move: accounts allowed one render
   at a time, whose first job is a render that never finishes, each with up to the per-key stream limit of jobs
   queued behind it. Over `--idle-s` seconds, with them open, against the same span before they were opened:
   - CPU per idle stream per minute: the gateway processes' CPU (user + system) with the streams open less
     without, per stream, per minute;
   - RSS per stream: the gateway processes' resident memory with the streams open less before, per stream (KiB);
   - statements per idle stream per minute: what the gateway sent PostgreSQL with them open less without (see 3).
   The waiting jobs are then canceled, and each stream must end on its job's `canceled` event.
2. The launch. `--accounts` accounts, each allowed 2 renders at once (so their queues run deep), create
   `--jobs-per-account` jobs each of `--render-s` second renders, round robin; then `--streams` streams are
   opened, one per job, spread evenly over each account's queue (its first job, its last, and between), and
   followed until their jobs end. Per stream: refused at open (and the status: 429 is a stream limit, 503 a
   database that did not answer in time), saw its job's final state (completed, failed, canceled, expired),
   ended early (closed, or broken, before that final event), still open (its job had ended
   and no final event came within `--grace-s`); the time from the request to the first event, and the lag of
   every later event (its `updated_at` to its arrival here, the same clock).
   Meanwhile another account reads one of its own jobs (a render in flight) `--get-rate` times a second, open
   loop, from a process of its own: p50 and p99 of that GET; beside it, at the same rate, GET /healthz (answered
   by the gateway's process alone: its event loop and the machine, no database) and how late the probe's own
   timer ran (the machine alone). `--streams 0` is the control: the same launch with no stream open.
3. Statements per job state change: every statement the stack's services sent PostgreSQL from the first stream's
   opening to the last stream's end (counted from PostgreSQL's log, as bench/statements.py does: pgserver has no
   pg_stat_statements) over the transitions recorded in `job_transitions` for the run's jobs in that span (the
   jobs are all created before it, so their creates are outside it), by service; then the gateway's share less
   the reader's GETs (each costs what a GET cost alone, measured first on the quiet stack, less the statements
   the gateway sends unasked meanwhile). The gateway's share holds the streams' reads and its own work per change,
   the same with or without streams (provider callbacks, its outbox relay);
   `--show-statements N` lists its statements. Logging every statement costs PostgreSQL CPU (never the
   gateway's); `--no-statements` leaves it off.
   With a PostgreSQL of the caller's (VIDJOBS_DATABASE_URL, a scratch database on it) statements are counted when
   its log is the pgserver layout's `<data directory>/log`, readable here.

The report gives each configuration's figures, then one table with a column per configuration. Streams need file
descriptors: the soft limit is raised to the hard one before anything starts (the services inherit it). This
process's own CPU is printed too: on a small machine the clients compete with the stack for its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import cpu, statements  # noqa: E402
from bench.backlog import count, new_accounts  # noqa: E402
from bench.dispatch import drop_database, scratch_database  # noqa: E402
from bench.lifecycle import own_stack, percentile  # noqa: E402

TERMINAL = frozenset({"completed", "failed", "canceled", "expired"})
SQL_TERMINAL = "('completed', 'failed', 'canceled', 'expired')"
HOLD = {"model": "fake/default", "prompt": "holds a slot", "duration_s": 1, "seed": 7, "params": {"scenario": "hang"}}
CREATES_IN_FLIGHT = 32
RETRIES = 10  # a create or cancel refused with 503 or 429 is tried again, this many times in all
CALIBRATION_GETS = 50
CALIBRATION_QUIET_S = 5.0


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def render(render_s: float) -> dict[str, Any]:
    return {"model": "fake/default", "prompt": "stream benchmark", "duration_s": 1, "seed": 7,
            "params": {"render_s": render_s}}


# --- the client side of one stream -----------------------------------------------------------------------


@dataclass
class Watch:
    job_id: str
    url: str  # the gateway it is opened on
    key: str
    refused: str | None = None  # never opened: the status ("429"), or the error's name
    opened_s: float | None = None  # request to first event
    events: int = 0
    keepalives: int = 0
    retry_hint: bool = False  # the gateway said `retry:` (it ended the stream early, on purpose)
    final: str | None = None  # the terminal status its last event showed
    ended_early: str | None = None  # how it ended before its job's final event
    still_open: bool = False  # its job had ended, and no final event had come
    lags: list[float] = field(default_factory=list)  # updated_at -> arrival of each event after the first, s


async def follow(session: aiohttp.ClientSession, watch: Watch, opening: asyncio.Semaphore) -> None:
    """Open the stream and read it to its end: the minimal Server-Sent Events parser an EventSource is.
    `opening` is held until the gateway answers the request (the first event, or a refusal)."""
    headers = {"Authorization": f"Bearer {watch.key}", "Accept": "text/event-stream"}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=120, sock_read=None)
    holding = True
    await opening.acquire()
    started = time.perf_counter()
    try:
        async with session.get(f"{watch.url}/v1/jobs/{watch.job_id}/stream", headers=headers,
                               timeout=timeout) as resp:
            if resp.status != 200:
                watch.refused = str(resp.status)
                return
            event, data, shown = "message", [], None
            async for raw in resp.content:
                line = raw.rstrip(b"\r\n")
                if line.startswith(b":"):
                    watch.keepalives += 1
                elif line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
                elif line.startswith(b"retry:"):
                    watch.retry_hint = True
                elif not line and data:
                    if event == "job":
                        job = json.loads(b"\n".join(data))
                        arrived = time.time()
                        watch.events += 1
                        if watch.opened_s is None:
                            watch.opened_s = time.perf_counter() - started
                            if holding:
                                opening.release()
                                holding = False
                        elif (job["status"], job["updated_at"]) != shown:
                            watch.lags.append(arrived - datetime.fromisoformat(job["updated_at"]).timestamp())
                        shown = (job["status"], job["updated_at"])
                        if job["status"] in TERMINAL:
                            watch.final = job["status"]
                    event, data = "message", []
                elif not line:
                    event = "message"
        if watch.final is None:
            watch.ended_early = "closed" + (" after retry:" if watch.retry_hint else "")
    except asyncio.CancelledError:
        if watch.final is None:
            watch.still_open = True
        raise
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        if watch.events == 0:
            watch.refused = type(exc).__name__
        elif watch.final is None:
            watch.ended_early = type(exc).__name__
    finally:
        if holding:
            opening.release()


class Streams:
    """Every stream of a phase, opened `parallel` at a time, each read in a task of its own."""

    def __init__(self, session: aiohttp.ClientSession, watches: list[Watch], parallel: int):
        self.watches = watches
        self._opening = asyncio.Semaphore(parallel)
        self._tasks = [asyncio.ensure_future(follow(session, w, self._opening)) for w in watches]

    def answered(self) -> int:
        return sum(1 for w in self.watches if w.opened_s is not None or w.refused is not None)

    def running(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    async def wait_answered(self, what: str) -> None:
        last = 0.0
        while self.answered() < len(self.watches) and self.running():
            if time.monotonic() - last > 2:
                say(f"  {what}: {self.answered()}/{len(self.watches)} answered")
                last = time.monotonic()
            await asyncio.sleep(0.2)

    async def wait_ended(self, within_s: float) -> None:
        """Each stream's end, or cancel what is still open after `within_s`."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=within_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def tally(watches: list[Watch]) -> dict[str, Any]:
    opened = [w for w in watches if w.refused is None]
    return {
        "streams": len(watches), "opened": len(opened),
        "refused": Counter(w.refused for w in watches if w.refused is not None),
        "final": sum(1 for w in watches if w.final), "by_final": Counter(w.final for w in watches if w.final),
        "early": Counter(w.ended_early for w in watches if w.ended_early),
        "still_open": sum(1 for w in watches if w.still_open),
        "retry_hints": sum(1 for w in watches if w.retry_hint),
        "open_ms": [w.opened_s * 1000 for w in opened if w.opened_s is not None],
        "lag_ms": [lag * 1000 for w in watches for lag in w.lags],
        "events": sum(w.events for w in watches), "keepalives": sum(w.keepalives for w in watches),
    }


# --- the reader: one account polling a job of its own -----------------------------------------------------


class Reader:
    """Another account's probes, `rate` times a second each, on a schedule (open loop: a slow answer does not
    slow the next): GET /v1/jobs/{id} of its own job; GET /healthz, which the gateway answers from the process
    alone (no database, so what it waits for is the gateway's event loop and the machine); and the probe
    process's own timer, how late its ticks run (the machine's scheduling alone, with no server in the way).
    They run in a process of their own, so the 10,000 streams' clients in this one do not delay their clock
    (a thread here would wait for this process's interpreter lock)."""

    def __init__(self, url: str, key: str, job_id: str, rate: float):
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._answers, sent = context.Pipe(duplex=False)
        self._process = context.Process(target=_probe_process, args=(url, key, job_id, rate, self._stop, sent),
                                        daemon=True)
        self.latencies_ms: list[float] = []  # the job's GETs
        self.health_ms: list[float] = []  # /healthz
        self.late_ms: list[float] = []  # the probe's own ticks, how late each ran
        self.errors: Counter[str] = Counter()

    async def start(self) -> None:
        """Once the probes have started (a process takes a second or two to start and import)."""
        self._process.start()
        assert await asyncio.to_thread(self._answers.recv) == "probing"

    async def stop(self) -> None:
        self._stop.set()
        found = await asyncio.to_thread(self._answers.recv)
        await asyncio.to_thread(self._process.join)
        self.latencies_ms, self.health_ms, self.late_ms = found["job"], found["health"], found["late"]
        self.errors = Counter(found["errors"])


def _probe_process(url: str, key: str, job_id: str, rate: float, stop: Any, answers: Any) -> None:
    found: dict[str, Any] = {"job": [], "health": [], "late": [], "errors": Counter()}
    asyncio.run(_probe(url, key, job_id, rate, stop, found, lambda: answers.send("probing")))
    answers.send(found)


async def _probe(url: str, key: str, job_id: str, rate: float, stop: Any, found: dict[str, Any],
                 started: Callable[[], None]) -> None:
    async def one(session: aiohttp.ClientSession, path: str, into: str, headers: dict[str, str]) -> None:
        started = time.perf_counter()
        try:
            async with session.get(f"{url}{path}", headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    found["errors"][f"{into} {resp.status}"] += 1
                    return
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            found["errors"][f"{into} {type(exc).__name__}"] += 1
            return
        found[into].append((time.perf_counter() - started) * 1000)

    loop = asyncio.get_running_loop()
    auth = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        started()
        start, n, tasks = loop.time(), 0, set()
        while not stop.is_set():
            due = start + n / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            found["late"].append(max(0.0, loop.time() - due) * 1000)
            for task in (asyncio.ensure_future(one(session, f"/v1/jobs/{job_id}", "job", auth)),
                         asyncio.ensure_future(one(session, "/healthz", "health", {}))):
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks, return_exceptions=True)


# --- the stack: its gateways, their processes, PostgreSQL's log ----------------------------------------------


@contextlib.asynccontextmanager
async def more_gateways(settings: Any, count: int):
    """`count` more gateway processes with the stack's settings, each on a port of its own: their addresses."""
    from vidjobs.cli.embedded import free_port
    from vidjobs.cli.supervisor import Supervisor
    from vidjobs.cli.up import wait_ready

    supervisors, urls = [], []
    try:
        for _ in range(count):
            own = settings.with_(http_port=free_port())
            supervisor = Supervisor(own.to_env(), services={"gateway": "vidjobs.gateway"})
            supervisors.append(supervisor)
            await supervisor.start_all()
            await wait_ready(own.gateway_url, supervisor)
            urls.append(own.gateway_url)
        yield urls
    finally:
        for supervisor in supervisors:
            await supervisor.close()


def gateway_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "vidjobs.gateway" in proc.cmdline():
                found.append(proc)
    return found


def gateway_rss_kib() -> float:
    total = 0.0
    for proc in gateway_processes():
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss / 1024
    return total


def own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


async def gateway_cpu_over(data_dir: Path, seconds: float) -> float:
    """The gateway processes' CPU seconds over the next `seconds`."""
    before = cpu.snapshot(data_dir)
    await asyncio.sleep(seconds)
    spent = cpu.usage(before, cpu.snapshot(data_dir))
    for note in spent.notes:
        say(f"  note: {note}")
    return spent.seconds.get("gateway", 0.0)


class Statements:
    """Statements the stack's services send PostgreSQL in a span, from its log (bench/statements.py)."""

    def __init__(self, database_url: str, log: Path | None, database: str):
        self.database_url, self.log, self.database = database_url, log, database
        self._offset = 0
        self.last: Counter[str] = Counter()  # the last span's statements, by their text

    @classmethod
    async def find(cls, database_url: str, data_dir: Path, wanted: bool) -> Statements:
        conn = await asyncpg.connect(database_url)
        try:
            database = await conn.fetchval("SELECT current_database()")
            log: Path | None = data_dir / "postgres" / "log"
            if not log.is_file():  # a server of the caller's: its log, where it is pgserver's and readable
                with contextlib.suppress(asyncpg.PostgresError):
                    log = Path(await conn.fetchval("SHOW data_directory")) / "log"
        finally:
            await conn.close()
        usable = wanted and log is not None and log.is_file() and os.access(log, os.R_OK)
        return cls(database_url, log if usable else None, database)

    async def start(self) -> None:
        if self.log:
            self._offset = self.log.stat().st_size
            await statements.start_logging(self.database_url)

    async def stop(self) -> Counter[str] | None:
        """Statements by service (gateway, submitter, ...) since `start`; None when they are not counted."""
        if not self.log:
            return None
        await asyncio.sleep(0.5)  # the last statements reach the log
        await statements.stop_logging(self.database_url)
        by_service: Counter[str] = Counter()
        self.last = Counter()
        for sql, n in statements.count(self.log, self._offset, self.database).items():
            service = sql.split("]", 1)[0].lstrip("[")
            if service not in ("?", "unknown"):  # this script's own sessions name no application
                by_service[service] += n
                self.last[sql] += n
        return by_service


async def pg_now(database_url: str) -> datetime:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT clock_timestamp()")
    finally:
        await conn.close()


# --- the API ---------------------------------------------------------------------------------------------


async def api(session: aiohttp.ClientSession, method: str, url: str, key: str, body: dict | None = None,
              *, tries: int = 1, idempotency_key: str | None = None) -> dict:
    """The answer's body; a refusal the API calls retryable (503, 429) is tried again after its Retry-After, up to
    `tries` times in all (a create with the same Idempotency-Key, so a retry cannot make a second job)."""
    headers = {"Authorization": f"Bearer {key}", **({"Idempotency-Key": idempotency_key} if idempotency_key else {})}
    for attempt in range(1, tries + 1):
        async with session.request(method, url, json=body, headers=headers) as resp:
            data = await resp.json()
            if resp.status < 300:
                return data
            if resp.status not in (429, 503) or attempt == tries:
                raise RuntimeError(f"{method} {url} answered {resp.status}: {data}")
            wait_s = min(float(resp.headers.get("Retry-After", "1")), 5.0)
        await asyncio.sleep(wait_s)
    raise AssertionError("unreachable")


async def create_many(session: aiohttp.ClientSession, url: str, orders: list[tuple[str, dict]], what: str) -> list[str]:
    """One job per (key, body), `CREATES_IN_FLIGHT` at a time, in order; their ids."""
    slots, done, last = asyncio.Semaphore(CREATES_IN_FLIGHT), 0, time.monotonic()

    async def one(key: str, body: dict) -> str:
        nonlocal done, last
        async with slots:
            job_id = (await api(session, "POST", f"{url}/v1/jobs", key, body, tries=RETRIES,
                                idempotency_key=uuid.uuid4().hex))["id"]
        done += 1
        if time.monotonic() - last > 2:
            say(f"  {what}: {done}/{len(orders)} created")
            last = time.monotonic()
        return job_id

    return list(await asyncio.gather(*(one(key, body) for key, body in orders)))


async def cancel_many(session: aiohttp.ClientSession, url: str, jobs: list[tuple[str, str]]) -> int:
    """Cancel each job; how many cancels were refused even after their retries."""
    slots, refused = asyncio.Semaphore(CREATES_IN_FLIGHT), 0

    async def one(key: str, job_id: str) -> None:
        nonlocal refused
        async with slots:
            try:
                await api(session, "POST", f"{url}/v1/jobs/{job_id}/cancel", key, tries=RETRIES)
            except RuntimeError as exc:
                refused += 1
                if refused == 1:
                    say(f"  a cancel was refused: {exc}")

    await asyncio.gather(*(one(key, job_id) for key, job_id in jobs))
    return refused


async def wait_for(predicate, what: str, within_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + within_s
    while not await predicate():
        if time.monotonic() > deadline:
            say(f"  gave up waiting for {what} after {within_s:.0f} s")
            return False
        await asyncio.sleep(every_s)
    return True


def spread(total: int, over: int) -> list[int]:
    """`total` split over `over` parts as evenly as whole numbers go."""
    return [total // over + (1 if i < total % over else 0) for i in range(over)]


def evenly(n: int, of: int) -> list[int]:
    """`n` indexes of `of` spread from the first to the last."""
    if n <= 0:
        return []
    if n == 1:
        return [0]
    return sorted({round(i * (of - 1) / (n - 1)) for i in range(n)})


# --- the phases ------------------------------------------------------------------------------------------


async def idle_phase(session: aiohttp.ClientSession, urls: list[str], settings: Any, data_dir: Path,
                     counter: Statements, args: argparse.Namespace) -> dict[str, Any]:
    """Streams on jobs that wait behind a render that never ends: the gateway's CPU, memory and statements."""
    db_url = settings.database_url
    per_account = min(settings.max_streams_per_key, settings.max_streams_per_account)
    sizes = spread(args.idle_streams, math.ceil(args.idle_streams / per_account))
    say(f"idle: {args.idle_streams} streams on waiting jobs of {len(sizes)} accounts ...")
    accounts = await new_accounts(db_url, len(sizes), "idle", concurrency=1)
    holds = await create_many(session, urls[0], [(key, HOLD) for _, key in accounts], "holds")
    if not await wait_for(lambda: _rendering(db_url, holds), "every hold to be rendering", within_s=120):
        raise RuntimeError("the renders that hold the idle accounts' slots never started")
    orders = [(key, render(args.render_s)) for (_, key), size in zip(accounts, sizes, strict=True) for _ in range(size)]
    waiting = await create_many(session, urls[0], orders, "waiting jobs")
    base_s = min(args.idle_s, 10.0)
    say(f"  the gateway without them, {base_s:.0f} s ...")
    rss_before = gateway_rss_kib()
    await counter.start()
    cpu_without = await gateway_cpu_over(data_dir, base_s) / base_s * 60
    quiet = await counter.stop()
    watches = [Watch(job_id, urls[i % len(urls)], key) for i, ((key, _), job_id) in enumerate(zip(orders, waiting,
                                                                                                   strict=True))]
    streams = Streams(session, watches, args.open_parallel)
    await streams.wait_answered("idle streams")
    await asyncio.sleep(2.0)  # the last ones settle into their loop
    opened = sum(1 for w in watches if w.refused is None and w.opened_s is not None)
    rss_with = gateway_rss_kib()
    say(f"  the gateway with {opened} open, {args.idle_s:.0f} s ...")
    await counter.start()
    cpu_with = await gateway_cpu_over(data_dir, args.idle_s) / args.idle_s * 60
    idle_statements = await counter.stop()
    ended_idle = Counter(w.ended_early for w in watches if w.ended_early)
    say("  canceling the waiting jobs: each stream should end on its `canceled` ...")
    refused = await cancel_many(session, urls[0], [(key, job_id) for (key, _), job_id
                                                   in zip(orders, waiting, strict=True)])
    await streams.wait_ended(args.grace_s)
    await cancel_many(session, urls[0], [(key, job_id) for (_, key), job_id in zip(accounts, holds, strict=True)])
    # The gateway's statements a minute with the streams open, and without them.
    gateway_statements = None if idle_statements is None or quiet is None else (
        idle_statements.get("gateway", 0) / args.idle_s * 60, quiet.get("gateway", 0) / base_s * 60)
    return {**tally(watches), "open_idle": opened, "cpu_with": cpu_with, "cpu_without": cpu_without,
            "ended_idle": ended_idle, "cancels_refused": refused,
            "rss_before": rss_before, "rss_with": rss_with, "gateway_statements": gateway_statements,
            "top": top_statements(counter.last, "gateway", args.show_statements)}


def top_statements(counted: Counter[str], service: str, n: int) -> list[tuple[str, int]]:
    return [(sql, k) for sql, k in counted.most_common() if sql.startswith(f"[{service}]")][:n]


async def _rendering(database_url: str, ids: list[str]) -> bool:
    return await count(database_url, "SELECT count(*) FROM jobs WHERE id = ANY($1) "
                                     "AND status IN ('submitted', 'processing')", ids) == len(ids)


async def _terminal(database_url: str, ids: list[str]) -> int:
    return await count(database_url, f"SELECT count(*) FROM jobs WHERE id = ANY($1) AND status IN {SQL_TERMINAL}",
                       ids)


async def reader_job(session: aiohttp.ClientSession, url: str, key: str, database_url: str,
                     counter: Statements) -> tuple[str, float | None]:
    """The reader's job (a render in flight till the end), and the gateway's statements for one GET of it alone:
    those of `CALIBRATION_GETS` GETs less what the gateway sends meanwhile unasked (its relay's polls, ...),
    read over a quiet span first. Done first, on a stack with nothing else to do."""
    job_id = (await api(session, "POST", f"{url}/v1/jobs", key, HOLD))["id"]
    await wait_for(lambda: _rendering(database_url, [job_id]), "the reader's job to be rendering", within_s=120)
    await asyncio.sleep(1.0)
    await counter.start()
    started = time.monotonic()
    await asyncio.sleep(CALIBRATION_QUIET_S)
    quiet = await counter.stop()
    quiet_s = time.monotonic() - started
    await counter.start()
    started = time.monotonic()
    for _ in range(CALIBRATION_GETS):
        await api(session, "GET", f"{url}/v1/jobs/{job_id}", key)
    gets_s = time.monotonic() - started
    counted = await counter.stop()
    if counted is None or quiet is None:
        return job_id, None
    unasked = quiet.get("gateway", 0) / quiet_s * gets_s
    return job_id, max(0.0, counted.get("gateway", 0) - unasked) / CALIBRATION_GETS


async def gc_pauses(session: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float, float] | None:
    """The gateways' full collections so far (vidjobs_gc_pause_seconds, generation 2), summed: how many, how many
    stopped the process over 100 ms, and their seconds in all. None where a gateway does not export them."""
    count = within = seconds = 0.0
    for url in urls:
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        full = [sample for family in text_string_to_metric_families(text) if family.name == "vidjobs_gc_pause_seconds"
                for sample in family.samples if sample.labels.get("generation") == "2"]
        if not full:
            return None
        for sample in full:
            if sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                seconds += sample.value
            elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == 0.1:
                within += sample.value
    return count, count - within, seconds


async def launch_phase(session: aiohttp.ClientSession, urls: list[str], settings: Any, data_dir: Path,
                       reader: tuple[str, str, float | None], counter: Statements,
                       args: argparse.Namespace) -> dict[str, Any]:
    """`reader`: the other account's key, its job, and the gateway's statements for one GET of it."""
    db_url = settings.database_url
    reader_key, reader_id, per_get = reader
    say(f"launch: {args.accounts} accounts x {args.jobs_per_account} jobs of {args.render_s:g} s, "
        f"{args.streams} streams ...")
    accounts = await new_accounts(db_url, args.accounts, "launch", concurrency=2)
    keys = [key for _, key in accounts]
    orders = [(keys[a], render(args.render_s)) for _ in range(args.jobs_per_account) for a in range(len(keys))]
    ids = await create_many(session, urls[0], orders, "jobs")
    by_account: list[list[str]] = [ids[a::len(keys)] for a in range(len(keys))]
    chosen = [(keys[a], by_account[a][i]) for a, n in enumerate(spread(args.streams, len(keys)))
              for i in evenly(n, args.jobs_per_account)]
    watches = [Watch(job_id, urls[i % len(urls)], key) for i, (key, job_id) in enumerate(chosen)]
    streamed = [w.job_id for w in watches]

    started_at = await pg_now(db_url)
    cpu_before, own_before = cpu.snapshot(data_dir), own_cpu_s()
    gc_before = await gc_pauses(session, urls)
    await counter.start()
    polling = Reader(urls[0], reader_key, reader_id, args.get_rate)
    await polling.start()
    began = time.monotonic()
    streams = Streams(session, watches, args.open_parallel)
    await streams.wait_answered("streams")
    say(f"  {sum(1 for w in watches if w.refused is None)} streams open; waiting for {len(ids)} jobs ...")
    longest = math.ceil(args.jobs_per_account / 2) * args.render_s
    last = 0.0

    async def all_ended() -> bool:
        nonlocal last
        done = await _terminal(db_url, ids)
        if time.monotonic() - last > 5:
            say(f"  {done}/{len(ids)} jobs ended, {streams.running()} streams open")
            last = time.monotonic()
        return done == len(ids)

    finished = await wait_for(all_ended, "every job to end", within_s=3 * longest + 600, every_s=2.0)
    jobs_s = time.monotonic() - began
    await streams.wait_ended(args.grace_s)
    wall_s = time.monotonic() - began
    await polling.stop()
    counted = await counter.stop()
    ended_at = await pg_now(db_url)
    spent = cpu.usage(cpu_before, cpu.snapshot(data_dir))
    own = own_cpu_s() - own_before
    gc_after = await gc_pauses(session, urls)
    gc_full = None if gc_before is None or gc_after is None else tuple(
        a - b for a, b in zip(gc_after, gc_before, strict=True))

    conn = await asyncpg.connect(db_url)
    try:
        moves = """SELECT count(*) FROM job_transitions WHERE job_id = ANY($1) AND at BETWEEN $2 AND $3"""
        transitions = await conn.fetchval(moves, ids, started_at, ended_at)
        streamed_transitions = await conn.fetchval(moves, streamed, started_at, ended_at)
        outcomes = dict(await conn.fetch("SELECT status::text, count(*) FROM jobs WHERE id = ANY($1) GROUP BY 1",
                                         ids))
    finally:
        await conn.close()
    return {**tally(watches), "jobs": len(ids), "finished": finished, "outcomes": outcomes, "jobs_s": jobs_s,
            "wall_s": wall_s, "gets": polling.latencies_ms, "health": polling.health_ms,
            "late": polling.late_ms, "get_errors": polling.errors, "gc": gc_full, "per_get": per_get,
            "statements": counted, "transitions": transitions, "streamed_transitions": streamed_transitions,
            "cpu": spent, "own_cpu": own, "top": top_statements(counter.last, "gateway", args.show_statements)}


async def one_configuration(gateways: int, args: argparse.Namespace) -> dict[str, Any]:
    from vidjobs.common.settings import load

    given = load()
    # On a server of the caller's (VIDJOBS_DATABASE_URL), a scratch database of its own, dropped after.
    scratch = await scratch_database(given.database_url) if given.database_url else None
    try:
        with tempfile.TemporaryDirectory(prefix="vidjobs-streams-") as tmp:
            data_dir = Path(tmp)
            say(f"starting an embedded stack with {gateways} gateway process{'es' if gateways > 1 else ''} ...")
            # Renders that hold a slot must outlast the sitting (their deadline is fixed at submission).
            overrides: dict[str, Any] = {"render_deadline_s": 86400.0}
            if scratch:
                overrides["database_url"] = scratch[1]
            async with own_stack(data_dir, **overrides) as (url, key, settings), \
                    more_gateways(settings, gateways - 1) as others, \
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0)) as session:
                urls = [url, *others]
                counter = await Statements.find(settings.database_url, data_dir, args.statements)
                job_id, per_get = await reader_job(session, url, key, settings.database_url, counter)
                idle = await idle_phase(session, urls, settings, data_dir, counter, args) if args.idle_streams else None
                report_idle(idle, gateways, args)
                launch = await launch_phase(session, urls, settings, data_dir, (key, job_id, per_get), counter, args)
                report_launch(launch, args)
    finally:
        if scratch:
            await drop_database(given.database_url, scratch[0])
    return {"gateways": gateways, "idle": idle, "launch": launch, "counted": counter.log is not None}


# --- the report ------------------------------------------------------------------------------------------


def _pcts(values: list[float]) -> str:
    if not values:
        return "p50 -  p99 -"
    return f"p50 {percentile(values, 50):.1f} ms  p99 {percentile(values, 99):.1f} ms"


def _counts(counter: Counter) -> str:
    return ", ".join(f"{name} {n}" for name, n in counter.most_common()) or "none"


def figures(result: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """The table's rows for one configuration."""
    launch, idle = result["launch"], result["idle"]
    rows = {
        "streams opened": f"{launch['opened']}/{launch['streams']}",
        "refused at open": str(sum(launch["refused"].values())),
        "saw the final state": str(launch["final"]),
        "ended early": str(sum(launch["early"].values())),
        "still open at the end": str(launch["still_open"]),
        "open p50 ms": f"{percentile(launch['open_ms'], 50):.1f}" if launch["open_ms"] else "-",
        "open p99 ms": f"{percentile(launch['open_ms'], 99):.1f}" if launch["open_ms"] else "-",
        "event lag p50 ms": f"{percentile(launch['lag_ms'], 50):.1f}" if launch["lag_ms"] else "-",
        "event lag p99 ms": f"{percentile(launch['lag_ms'], 99):.1f}" if launch["lag_ms"] else "-",
        "GET p50 ms": f"{percentile(launch['gets'], 50):.1f}" if launch["gets"] else "-",
        "GET p99 ms": f"{percentile(launch['gets'], 99):.1f}" if launch["gets"] else "-",
        "/healthz p50 ms": f"{percentile(launch['health'], 50):.1f}" if launch["health"] else "-",
        "/healthz p99 ms": f"{percentile(launch['health'], 99):.1f}" if launch["health"] else "-",
        "probe's timer late p99 ms": f"{percentile(launch['late'], 99):.1f}" if launch["late"] else "-",
        "full GCs (>100 ms) / s": "-" if launch["gc"] is None else
        f"{launch['gc'][0]:.0f} ({launch['gc'][1]:.0f}) / {launch['gc'][2]:.2f}",
        "statements/change": "-", "gateway statements/change": "-",
        "idle CPU s/stream/min": "-", "idle RSS KiB/stream": "-", "idle statements/stream/min": "-",
    }
    counted, transitions = launch["statements"], launch["transitions"]
    if counted is not None and transitions:
        rows["statements/change"] = f"{sum(counted.values()) / transitions:.2f}"
        if launch["per_get"] is not None:
            rows["gateway statements/change"] = f"{gateway_less_gets(launch) / transitions:.2f}"
    if idle and idle["open_idle"]:
        n = idle["open_idle"]
        rows["idle CPU s/stream/min"] = f"{(idle['cpu_with'] - idle['cpu_without']) / n:.5f}"
        rows["idle RSS KiB/stream"] = f"{(idle['rss_with'] - idle['rss_before']) / n:.1f}"
        if idle["gateway_statements"] is not None:
            with_them, without = idle["gateway_statements"]
            rows["idle statements/stream/min"] = f"{(with_them - without) / n:.3f}"
    return rows


def gateway_less_gets(launch: dict[str, Any]) -> float:
    return launch["statements"].get("gateway", 0) - len(launch["gets"]) * launch["per_get"]


def report_idle(idle: dict[str, Any], gateways: int, args: argparse.Namespace) -> None:
    print(f"== {gateways} gateway process{'es' if gateways > 1 else ''} ==", flush=True)
    if idle:
        n = idle["open_idle"]
        print(f"idle: {n}/{idle['streams']} streams open on waiting jobs for {args.idle_s:g} s; "
              f"refused {_counts(idle['refused'])}")
        if n:
            above = idle["cpu_with"] - idle["cpu_without"]
            print(f"  gateway CPU: {idle['cpu_with']:.3f} s/min with them, {idle['cpu_without']:.3f} s/min without: "
                  f"{above / n:.5f} s per idle stream per minute")
            print(f"  gateway RSS: {idle['rss_before'] / 1024:.1f} MiB before, {idle['rss_with'] / 1024:.1f} MiB "
                  f"with them: {(idle['rss_with'] - idle['rss_before']) / n:.1f} KiB per stream")
        if idle["gateway_statements"] is not None and n:
            with_them, without = idle["gateway_statements"]
            print(f"  gateway statements: {with_them:.0f}/min with them, {without:.0f}/min without: "
                  f"{(with_them - without) / n:.3f} per idle stream per minute")
            for sql, k in idle["top"]:
                print(f"    {k / args.idle_s * 60 / n:8.3f}  {sql}")
        print(f"  ended during the idle span: {_counts(idle['ended_idle'])}")
        print(f"  on cancel: {idle['by_final'].get('canceled', 0)} saw `canceled`, ended early in all "
              f"{_counts(idle['early'])}, still open {idle['still_open']}; cancels refused after "
              f"{RETRIES} tries {idle['cancels_refused']}", flush=True)


def report_launch(launch: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"launch: {launch['jobs']} jobs ({args.accounts} accounts x {args.jobs_per_account}, {args.render_s:g} s "
          f"renders, 2 at once per account): {_counts(Counter(launch['outcomes']))}"
          + ("" if launch["finished"] else " (not every job ended)"))
    print(f"  streams: {launch['opened']}/{launch['streams']} opened, refused {_counts(launch['refused'])}; "
          f"saw the final state {launch['final']}, ended early {_counts(launch['early'])}, "
          f"still open at the end {launch['still_open']}, `retry:` hints {launch['retry_hints']}")
    print(f"  open -> first event: {_pcts(launch['open_ms'])}")
    print(f"  event lag (updated_at -> here): {_pcts(launch['lag_ms'])} over {len(launch['lag_ms'])} events "
          f"({launch['events']} events and {launch['keepalives']} keepalives in all)")
    print(f"  GET /v1/jobs/{{id}} meanwhile ({args.get_rate:g}/s, another account): {_pcts(launch['gets'])} "
          f"({len(launch['gets'])} answered, errors {_counts(launch['get_errors'])})")
    print(f"  GET /healthz meanwhile (the gateway's loop, no database): {_pcts(launch['health'])}; the probe's own "
          f"timer late by {_pcts(launch['late'])} (the machine, no server)")
    if launch["gc"] is not None:
        full, over, seconds = launch["gc"]
        print(f"  the gateways' full garbage collections: {full:.0f}, {over:.0f} of them over 100 ms, "
              f"{seconds:.2f} s in all")
    print(f"  every job ended {launch['jobs_s']:.1f} s after the first stream was asked for; the last stream "
          f"{launch['wall_s']:.1f} s")
    counted, transitions = launch["statements"], launch["transitions"]
    if counted is None:
        print("  statements: not counted (no PostgreSQL log here, or --no-statements)")
    elif transitions:
        total = sum(counted.values())
        print(f"  statements per job state change: {total / transitions:.2f} ({total} statements, {transitions} "
              "transitions of the run's jobs): "
              + ", ".join(f"{name} {n / transitions:.2f}" for name, n in counted.most_common()))
        if launch["per_get"] is not None:
            print(f"  gateway statements per job state change, the reader's GETs left out: "
                  f"{gateway_less_gets(launch) / transitions:.2f} ({counted.get('gateway', 0)} less "
                  f"{len(launch['gets']) * launch['per_get']:.0f} for {len(launch['gets'])} GETs at "
                  f"{launch['per_get']:.1f} each; {launch['streamed_transitions']} of the transitions were of jobs "
                  "with a stream)")
            for sql, k in launch["top"]:
                print(f"    {k / transitions:8.3f}  {sql}")
    spent = launch["cpu"]
    print("  CPU over the run, s: " + ", ".join(f"{part} {s:.1f}" for part, s in sorted(
        spent.seconds.items(), key=lambda kv: -kv[1])) + f"; this script {launch['own_cpu']:.1f}")
    for note in spent.notes:
        print(f"  note: {note}")
    sys.stdout.flush()


def report_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    columns = [figures(r, args) for r in results]
    heads = [f"{r['gateways']} gateway{'s' if r['gateways'] > 1 else ''}" for r in results]
    print(f"== {args.streams} streams, {args.idle_streams} idle ==")
    print(f"{'':<28}" + "".join(f"{h:>14}" for h in heads))
    for row in columns[0]:
        print(f"{row:<28}" + "".join(f"{c[row]:>14}" for c in columns))


def raise_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < needed:
        say(f"note: {soft} file descriptors at most (the hard limit); {needed} streams and their sockets need more")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateways", default="1", help="gateway processes, comma-separated runs: 1, 2 or 1,2")
    parser.add_argument("--accounts", type=int, default=100, help="accounts of the launch (2 renders at once each)")
    parser.add_argument("--jobs-per-account", type=int, default=50)
    parser.add_argument("--render-s", type=float, default=20.0, help="each render's seconds on the fake provider")
    parser.add_argument("--streams", type=int, default=1000, help="streams of the launch, one per job")
    parser.add_argument("--idle-streams", type=int, help="streams on waiting jobs (default: --streams; 0: none)")
    parser.add_argument("--idle-s", type=float, default=60.0, help="how long the idle streams are measured")
    parser.add_argument("--get-rate", type=float, default=10.0, help="the other account's GETs a second")
    parser.add_argument("--open-parallel", type=int, default=64, help="streams being opened at once")
    parser.add_argument("--grace-s", type=float, default=20.0,
                        help="how long a stream may stay open once its job has ended (a keepalive is 15 s)")
    parser.add_argument("--show-statements", type=int, default=0, metavar="N",
                        help="list the gateway's N most frequent statements of each phase")
    parser.add_argument("--no-statements", dest="statements", action="store_false",
                        help="leave PostgreSQL's statement log off (no statement counts)")
    args = parser.parse_args()
    if args.idle_streams is None:
        args.idle_streams = args.streams
    if args.streams > args.accounts * args.jobs_per_account:
        parser.error(f"--streams {args.streams}: one stream per job, and there are "
                     f"{args.accounts * args.jobs_per_account} jobs")
    configurations = [int(n) for n in args.gateways.split(",")]
    if any(n < 1 for n in configurations):
        parser.error("--gateways: 1 or more processes")
    raise_file_limit(max(args.streams, args.idle_streams) + 1024)
    results = []
    for gateways in configurations:
        results.append(await one_configuration(gateways, args))
    report_table(results, args)


if __name__ == "__main__":
    asyncio.run(main())
