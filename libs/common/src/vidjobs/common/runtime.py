"""What every service process shares: settings, the database pool, JetStream, the outbox relay, and a
start/stop discipline (SIGTERM sets a stop event; any side task that dies stops the service)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import asyncpg
import uvloop
from aiohttp import web
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vidjobs.common import backoff, bus, changes, db, dbcalls, faults, gcpolicy, logs, tracing
from vidjobs.common.dns import BoundedResolver
from vidjobs.common.errors import ConfigError, ErrorCode, JobError
from vidjobs.common.events import Event, WorkEvent
from vidjobs.common.outbox import Relay
from vidjobs.common.settings import Settings, load
from vidjobs.common.states import JobStatus, sources_of
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.common.waits import set_within

log = logging.getLogger("vidjobs.runtime")

E = TypeVar("E", bound=WorkEvent)


PROBE_TIMEOUT_S = 2.0
# Between a long-lived task's death and the process's exit, /readyz says why (probes see it first).
FAIL_GRACE_S = 2.0
# One pull waits at most a second for messages (bus.consume), and a relay pass is bounded by its publish
# and statement timeouts: far longer than this means a loop is wedged although its task is alive.
STUCK_AFTER_S = 30.0
RELAY_STUCK_AFTER_S = 90.0


@dataclass
class Runtime:
    name: str
    settings: Settings
    pool: asyncpg.Pool
    nc: NATS
    js: JetStreamContext
    relay: Relay
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None  # why the service is going down, once a long-lived task stopped
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    pulls: dict[str, bus.Pulls] = field(default_factory=dict)  # each consumer's pull loop, by durable name
    # A service's own readiness checks, asked first (media's: the object store answering); each says what is
    # wrong, or None.
    checks: list[Callable[[], Awaitable[str | None]]] = field(default_factory=list)

    def watch(self, work: Awaitable[None], name: str) -> asyncio.Task[None]:
        """Run a long-lived task that must live as long as the service: if it ends before the service is
        asked to stop (crashed or not), the service fails, so that it is restarted rather than left
        half-alive."""
        task = asyncio.ensure_future(work)
        task.set_name(name)
        task.add_done_callback(self._ended)
        self.tasks.append(task)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self.stop.is_set():
            return
        error = None if task.cancelled() else task.exception()
        self.fail(f"{task.get_name()} {'stopped' if error is None else f'died: {error!r}'}", error)

    def fail(self, why: str, error: BaseException | None = None) -> None:
        if self.failure is not None:
            return
        self.failure = why
        log.error("a long-lived task stopped; the service exits to be restarted", exc_info=error,
                  extra={"why": why})
        asyncio.get_running_loop().call_later(FAIL_GRACE_S, self.stop.set)

    async def readiness(self, *, pulls: bool = True) -> str | None:
        """What keeps this service from being ready, or None: a dependency that is unreachable, or a
        long-lived task or (with `pulls`) a consumer that is not working."""
        if self.failure is not None:
            return self.failure
        for check in self.checks:
            if why := await check():
                return why
        if not self.nc.is_connected:
            return "NATS unreachable"
        if why := await self._database_problem():
            return why
        return self._stalled(pulls)

    async def _database_problem(self) -> str | None:
        # A call of its own bound: the probe's stuck connection is abandoned, like any call's (dbcalls).
        try:
            with dbcalls.bounded(PROBE_TIMEOUT_S):
                await self.pool.fetchval("SELECT 1")
        except TimeoutError:
            log.warning("not ready: database not answering", extra={"within_s": PROBE_TIMEOUT_S})
            return "database not answering"
        except Exception as exc:
            log.warning("not ready: database", extra={"error": repr(exc)})
            return "database unreachable"
        return None

    def _stalled(self, pulls: bool) -> str | None:
        # A watched task that ended fails the service a moment later (its done callback); say so already.
        if ended := next((t.get_name() for t in self.tasks if t.done()), None):
            return f"{ended} ended"
        if self.relay.idle_for() > RELAY_STUCK_AFTER_S:
            return "outbox relay stuck"
        if not pulls:
            return None
        if not self.pulls:
            return "no consumer started yet"
        for durable, state in self.pulls.items():
            if why := state.problem(STUCK_AFTER_S):
                return f"consumer {durable} {why}"
        return None

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[asyncpg.Connection]:
        """A transaction whose outbox rows are published, and its job change hints sent, as soon as it
        commits."""
        async with changes.after_commit(), self.pool.acquire() as conn:
            async with conn.transaction():
                yield db.lent(conn)
        self.relay.poke()


# How long a starting service waits out the database or JetStream failing after its first look (a restart
# under way, a NATS node drained) before it gives up and exits: a process that exits instead is restarted,
# and under Kubernetes every such exit lengthens the back-off before the next start.
START_PATIENCE_S = 60.0
_START = backoff.Backoff(on=faults.INFRASTRUCTURE, attempts=None, timeout=START_PATIENCE_S, base=0.5, cap=5.0)


def _not_yet(step: str) -> backoff.OnBackoff:
    def told(exc: BaseException, attempt: int, wait_s: float) -> None:
        log.warning("could not start yet; trying again",
                    extra={"step": step, "error": repr(exc), "attempt": attempt, "delay_s": round(wait_s, 2)})
    return told


async def _wait_for_database(url: str, timeout_s: float = 60.0) -> None:
    # Readiness is observed, not slept for: retry the connection until it answers or time runs out.
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            conn = await asyncpg.connect(url, timeout=5)
            await conn.close()
            return
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise ConfigError(f"database at VIDJOBS_DATABASE_URL not reachable: {exc!r}") from exc
            await asyncio.sleep(0.5)


def _require_urls(settings: Settings) -> tuple[str, str]:
    if not settings.database_url or not settings.nats_url:
        raise ConfigError("VIDJOBS_DATABASE_URL and VIDJOBS_NATS_URL must be set (`vidjobs up` sets both)")
    return settings.database_url, settings.nats_url


async def migrate_database(settings: Settings) -> list[str]:
    """What a service does before it opens its runtime: wait for the database, apply the migrations it lacks
    and, on the schema owner's login, the service roles' grants (`db.migrate`); returns the names applied.
    On a service's own role with nothing pending this only reads; with something pending it fails, naming
    `vidjobs migrate`."""
    database_url, _ = _require_urls(settings)

    async def attempt(_: int) -> list[str]:
        await _wait_for_database(database_url)
        return await db.migrate(database_url)  # safe to run again: it applies only what is missing

    return await backoff.call(_START, attempt, on_backoff=_not_yet("migrate"))


async def _require_current_schema(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        missing = (await db.schema(db.lent(conn))).missing
    if missing:
        raise ConfigError(f"the database lacks migrations {missing}: run `vidjobs migrate` (as the schema's "
                          "owner) before starting a service")


@contextlib.asynccontextmanager
async def open_runtime(name: str, settings: Settings) -> AsyncIterator[Runtime]:
    """Connect a service to the database and JetStream (creating the streams it consumes if they are missing)
    and start its outbox relay. Changes no schema and no grant: a database that lacks a migration this code
    needs is refused (`migrate_database` comes first)."""
    BoundedResolver.configure(settings.dns_threads, settings.dns_timeout_s)
    pool, nc, js = await backoff.call(_START, lambda _: _connect(name, settings), on_backoff=_not_yet("connect"))
    try:
        changes.install(nc)
        rt = Runtime(name=name, settings=settings, pool=pool, nc=nc, js=js, relay=Relay(pool, js))
        rt.watch(rt.relay.run(rt.stop), "outbox-relay")
        try:
            yield rt
        finally:
            rt.stop.set()
            await asyncio.wait(rt.tasks, timeout=5)
    finally:
        changes.uninstall(nc)
        with contextlib.suppress(Exception):
            await nc.drain()
        await pool.close()


async def _connect(name: str, settings: Settings) -> tuple[asyncpg.Pool, NATS, JetStreamContext]:
    """The service's pool on a current schema, its NATS connection and the streams it uses; whatever was
    opened is closed again when a step fails, so the start can be tried again from the top."""
    database_url, nats_url = _require_urls(settings)
    await _wait_for_database(database_url)
    pool = await db.create_pool(database_url, max_size=settings.db_pool_size, timeouts=db.Timeouts.of(settings),
                                name=f"vidjobs-{name}")
    try:
        await _require_current_schema(pool)
        nc, js = await bus.connect(nats_url, name=f"vidjobs-{name}", ping_interval_s=settings.nats_ping_interval_s,
                                   max_outstanding_pings=settings.nats_max_outstanding_pings)
    except BaseException:
        await _close_quietly(pool)
        raise
    try:
        await bus.ensure_streams(js, replicas=settings.stream_replicas)
    except BaseException:
        with contextlib.suppress(Exception):
            await nc.close()
        await _close_quietly(pool)
        raise
    return pool, nc, js


async def _close_quietly(pool: asyncpg.Pool) -> None:
    """Close a pool whose database may be gone: the failure that made us close it is the one worth raising."""
    try:
        await asyncio.wait_for(pool.close(), timeout=PROBE_TIMEOUT_S)
    except Exception:
        pool.terminate()


async def health_app(rt: Runtime) -> web.AppRunner:
    """`/healthz` and `/metrics` for a worker, on its own port."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": rt.name})

    async def readyz(_: web.Request) -> web.Response:
        why = await rt.readiness()
        if why is not None:
            return web.json_response({"status": "not ready", "service": rt.name, "reason": why}, status=503)
        return web.json_response({"status": "ready", "service": rt.name})

    async def metrics_route(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, rt.settings.http_host, rt.settings.metrics_port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    log.info("health and metrics listening", extra={"port": port})
    return runner


def consumer(rt: Runtime, durable: str, subject: str, handler: bus.Handler[E], **options: Any) -> bus.ConsumerSpec[E]:
    """A consumer with this deployment's ack wait and delivery budget; a message that exhausts the budget is
    dead-lettered and its job failed with `internal`, never left looping."""
    defaults: dict[str, Any] = {
        "ack_wait_s": rt.settings.ack_wait_s, "max_deliver": rt.settings.max_deliveries,
        "on_dead": partial(fail_internal, rt), "pulls": rt.pulls.setdefault(durable, bus.Pulls()),
    }
    return bus.ConsumerSpec(durable=durable, subject=subject, handler=handler, **{**defaults, **options})


async def fail_internal(rt: Runtime, event: Event) -> None:
    job_id = getattr(event, "job_id", None)
    if job_id is None:
        return
    error = JobError.of(ErrorCode.INTERNAL, "A step of this job kept failing on our side, so it was stopped and "
                                            "reported. Submit it again; you were not charged.")
    async with rt.tx() as conn:
        await transition(conn, job_id, JobStatus.FAILED, reason=f"gave up on {type(event).__name__}",
                         expect=sources_of(JobStatus.FAILED), update=JobUpdate(error=error, progress=None))


async def pause(rt: Runtime, seconds: float) -> None:
    """Sleep `seconds`, waking at once when the runtime is asked to stop."""
    await set_within(rt.stop, seconds)


async def every(rt: Runtime, seconds: float, one_pass: Callable[[], Awaitable[None]], what: str) -> None:
    """Run a periodic sweep until the runtime stops. Sweeps are safety nets: a failed pass is logged and the
    next one tries again, rather than taking the service down."""
    while not rt.stop.is_set():
        try:
            await one_pass()
        except Exception as exc:
            if faults.is_infrastructure(exc):
                log.warning("%s could not run; trying again next pass", what, extra={"error": repr(exc)})
            else:
                log.exception("%s failed; trying again next pass", what)
        await pause(rt, seconds)


WorkerMain = Callable[[Runtime], Awaitable[None]]


async def _serve(name: str, settings: Settings, main: WorkerMain) -> int:
    await migrate_database(settings)
    async with open_runtime(name, settings) as rt:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, rt.stop.set)
        runner = await health_app(rt)
        work = rt.watch(main(rt), f"{name}-main")
        gcpolicy.install()
        try:
            await rt.stop.wait()
            await asyncio.wait({work}, timeout=30)  # in-flight work drains
            return 0 if rt.failure is None else 1
        finally:
            work.cancel()
            await runner.cleanup()


def run_worker(name: str, main: WorkerMain, *, check: Callable[[Settings], None] | None = None) -> None:
    """Entry point of `python -m vidjobs.<name>`; `check` refuses settings this worker cannot run on."""
    try:
        settings = load()
        if check is not None:
            check(settings)
    except ConfigError as exc:
        print(f"vidjobs {name}: {exc}", file=sys.stderr)
        sys.exit(2)
    logs.setup(name, level=settings.log_level, fmt=settings.log_format)
    tracing.setup(name)
    try:
        code = uvloop.run(_serve(name, settings, main))
    except ConfigError as exc:
        log.error(str(exc))
        code = 2
    finally:
        tracing.shutdown()
    sys.exit(code)
