"""The gateway application: the route table, the middlewares, and the resources and background work it
owns while it runs (the sweep of expired idempotency keys)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import aiohttp
import msgspec
from aiohttp import web

from vidjobs.common import bus, db, events, modelroutes, netguard, regenerations, tracing
from vidjobs.common.bus import Delivery
from vidjobs.common.estimates import Estimator
from vidjobs.common.events import AppEventDue
from vidjobs.common.runtime import Runtime, consumer, every, health_app, migrate_database, open_runtime
from vidjobs.common.settings import Settings
from vidjobs.gateway import (
    idempotency,
    inbox,
    ratelimit,
    routes_account,
    routes_app_webhooks,
    routes_callbacks,
    routes_exports,
    routes_files,
    routes_jobs,
    routes_keep,
    routes_models,
    routes_ops,
    routes_page,
    routes_platform,
    routes_reruns,
    routes_tokens,
    routes_uploads,
    sealing,
    stream,
)
from vidjobs.gateway.access import request_id_middleware, stamp_request_id
from vidjobs.gateway.apierrors import ErrorOut, error_middleware
from vidjobs.gateway.appwebhooks import deliveries, resealing, urls
from vidjobs.gateway.auth import auth_middleware, stamp_rate_limit
from vidjobs.gateway.browsertokens import Tokens
from vidjobs.gateway.deadlines import call_bound_middleware
from vidjobs.gateway.feeds import Feeds
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.gateway.openapi import openapi_route
from vidjobs.gateway.owned import view as owned_view
from vidjobs.gateway.platform_accounts import PlatformAccounts
from vidjobs.gateway.platformkeys import PlatformKeys
from vidjobs.gateway.processcaps import Bucket, StreamSlots
from vidjobs.gateway.purges import Purges
from vidjobs.gateway.requestmetrics import metrics_middleware
from vidjobs.gateway.routetable import Route, register
from vidjobs.gateway.state import GATEWAY, PUBLIC_ROUTES, ROUTE_ACCESS, SETTINGS, Gateway
from vidjobs.gateway.tenant import Tenant
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.registry import build_adapters
from vidjobs.storage.base import Storage
from vidjobs.storage.factory import open_storage

PROVIDER_TIMEOUT_S = 30
_NO_DEPENDENCY = frozenset({"healthz", "metrics"})  # answered from the process alone


def route_table(settings: Settings) -> list[Route]:
    routes = [
        *routes_jobs.ROUTES, *routes_reruns.ROUTES, *routes_keep.ROUTES, *routes_exports.ROUTES,
        *routes_models.ROUTES, *routes_app_webhooks.ROUTES, *stream.ROUTES, *routes_uploads.ROUTES,
        *routes_account.ROUTES, *routes_tokens.ROUTES, *routes_platform.ROUTES,
        *routes_callbacks.ROUTES, *routes_ops.ROUTES, *routes_page.ROUTES,
    ]
    if settings.api_metrics == "off":
        routes = [r for r in routes if r.name != "metrics"]  # served on the metrics port instead (_resources)
    # Objects are served here only when they live on our own disk; S3 hands out its own signed URLs.
    if settings.storage_location().startswith("file:"):
        routes += routes_files.ROUTES
    # Every request made with a credential spends from its rate (credentials.py), so any of them may hear 429;
    # and a credential that may not call the route (a scope it lacks) hears 403.
    routes = [dataclasses.replace(r, responses={**r.responses, 403: ErrorOut, 429: ErrorOut}) if r.auth else r
              for r in routes]
    # Any route that reads or writes the database may meet a dependency that is not answering (apierrors).
    routes = [r if r.name in _NO_DEPENDENCY else dataclasses.replace(r, responses={503: ErrorOut, **r.responses})
              for r in routes]
    return [*routes, openapi_route(routes)]


def _uncounted(sweep: Callable[[], Awaitable[int]]) -> Callable[[], Awaitable[None]]:
    """A sweep as `every` runs it: the count of rows it removed is for its own log and its tests."""
    async def one_pass() -> None:
        await sweep()
    return one_pass


async def _sweep_idempotency_keys(rt: Runtime) -> None:
    settings = rt.settings
    await every(rt, settings.idempotency_sweep_interval_s,
                _uncounted(partial(idempotency.sweep, rt.pool, settings.idempotency_ttl_s)), "idempotency key sweep")


async def _prune_webhook_inbox(rt: Runtime) -> None:
    settings = rt.settings
    await every(rt, settings.idempotency_sweep_interval_s,
                _uncounted(partial(inbox.prune, rt.pool, settings.webhook_retention_days)), "webhook inbox prune")


async def _prune_webhook_deliveries(rt: Runtime) -> None:
    settings = rt.settings
    await every(rt, settings.idempotency_sweep_interval_s,
                _uncounted(partial(deliveries.prune, rt.pool, settings.webhook_delivery_retention_days)),
                "webhook delivery prune")


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _resources(app: web.Application) -> AsyncIterator[None]:
    """Everything the gateway holds while it runs, opened in order and closed in reverse."""
    settings = app[SETTINGS]
    storage = open_storage(settings)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(storage.close)
        await migrate_database(settings)
        rt = await stack.enter_async_context(open_runtime("gateway", settings))
        try:
            await _start(app, rt, storage, stack)
            yield
        finally:
            # First at cleanup, and as well when the start is refused part-way (a secret sealed under a key we
            # lack): the tasks stopped next are not failures, and every loop ends on it even if its cancel is
            # lost, so the stack unwinds and the pool and NATS close.
            rt.stop.set()


async def _start(app: web.Application, rt: Runtime, storage: Storage, stack: contextlib.AsyncExitStack) -> None:
    """Open what the gateway holds over its runtime, and start its background work; each is closed or stopped
    by `stack`."""
    settings = rt.settings
    session = await stack.enter_async_context(
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROVIDER_TIMEOUT_S),
                              trace_configs=tracing.client_trace_configs()))
    adapters = build_adapters(settings, session)
    regenerations.offer(info.id for adapter in adapters.values() for info in adapter.models())
    for adapter in adapters.values():
        stack.push_async_callback(adapter.close)
    if settings.api_metrics == "off":
        ops = await health_app(rt)  # /metrics, /healthz and /readyz on VIDJOBS_METRICS_PORT only
        stack.push_async_callback(ops.cleanup)
    buckets = ratelimit.Buckets(rt.pool, settings)
    stack.push_async_callback(buckets.sync)  # the last spending, once the sync loop has stopped
    # Stopped before the pool they use is closed.
    for work, name in ((_sweep_idempotency_keys(rt), "idempotency-sweep"),
                       (_prune_webhook_inbox(rt), "webhook-inbox-prune"),
                       (_prune_webhook_deliveries(rt), "webhook-delivery-prune"),
                       (every(rt, ratelimit.SYNC_S, buckets.sync, "rate limit sync"), "rate-limit-sync")):
        stack.push_async_callback(_stop, rt.watch(work, name))
    streams = StreamSlots(per_account=settings.max_streams_per_account, per_key=settings.max_streams_per_key)
    rates = {name: Bucket(settings.webhook_rate_per_s, settings.webhook_rate_burst) for name in adapters}
    routes = await _live_routes(rt, adapters, stack)
    estimator = Estimator(settings)
    gw = Gateway(settings=settings, rt=rt, storage=storage, adapters=adapters, streams=streams,
                 buckets=buckets, platform_keys=PlatformKeys(rt.pool), tokens=Tokens(rt.pool), credential_rates={},
                 webhook_rates=rates, estimator=estimator, routes=routes,
                 platform_accounts=PlatformAccounts(rt),
                 feeds=await _stream_feeds(rt, lambda account_id: Tenant(rt, account_id, estimator, adapters, routes),
                                           stack))
    app[GATEWAY] = gw
    _purge_closed_accounts(gw, stack)
    await _seal_webhook_secrets(rt, stack)
    await _deliver_app_webhooks(gw, stack)


async def _stream_feeds(rt: Runtime, tenant_of: Callable[[str], Tenant],
                        stack: contextlib.AsyncExitStack) -> Feeds:
    """The jobs the event streams follow, read on a pool of their own (feeds.py)."""
    settings = rt.settings
    pool = await db.create_pool(settings.database_url, max_size=settings.stream_db_pool_size,
                                timeouts=db.Timeouts.of(settings), name="vidjobs-gateway-streams")
    stack.push_async_callback(pool.close)
    feeds = Feeds(rt.nc, pool, tenant_of, gap_s=settings.stream_coalesce_s, refresh_s=settings.estimate_refresh_s)
    await feeds.start()
    stack.push_async_callback(feeds.close)  # before the pool: its reads stop first
    stack.push_async_callback(_stop, rt.watch(feeds.refresh(rt.stop), "stream-estimates"))
    return feeds


async def _live_routes(rt: Runtime, adapters: dict[str, ProviderAdapter],
                       stack: contextlib.AsyncExitStack) -> LiveRoutes:
    """Seed the aliases of VIDJOBS_MODEL_ROUTES the table lacks, read the table before serving, and keep it
    current (liveroutes.py)."""
    settings = rt.settings
    await modelroutes.seed(rt.pool, settings.model_routes)
    usable = frozenset(info.id for adapter in adapters.values() for info in adapter.models())
    routes = LiveRoutes(rt.pool, settings.database_url, usable, settings.routes_refresh_s)
    await routes.load()
    stack.push_async_callback(_stop, rt.watch(routes.run(rt.stop), "model-routes"))
    return routes


async def _seal_webhook_secrets(rt: Runtime, stack: contextlib.AsyncExitStack) -> None:
    """Refuse to start over secrets sealed under a key we lack; seal what the previous release left in plain
    text before serving, and keep sweeping (appwebhooks/resealing.py)."""
    ring = sealing.keyring(rt.settings)
    await resealing.check_keys(rt.pool, ring)
    await resealing.sweep(rt.pool, ring)
    sweeping = every(rt, resealing.EVERY_S, _uncounted(partial(resealing.sweep, rt.pool, ring)),
                     "webhook secret sealing")
    stack.push_async_callback(_stop, rt.watch(sweeping, "webhook-secret-sealing"))


async def _deliver_app_webhooks(gw: Gateway, stack: contextlib.AsyncExitStack) -> None:
    """The consumer that turns moves into deliveries, and the deliverer that sends them (appwebhooks)."""
    rt = gw.rt
    session = await stack.enter_async_context(netguard.guarded_session(
        rt.settings.allowed_webhook_hosts(), purpose=urls.WEBHOOKS,
        timeout=aiohttp.ClientTimeout(total=rt.settings.app_webhook_timeout_s)))

    async def job_body(account_id: str, job_id: str) -> bytes | None:
        owned = await Tenant(rt, account_id, gw.estimator, gw.adapters, gw.routes).job(job_id)
        return None if owned is None else msgspec.json.encode(owned_view(gw, owned))

    deliverer = deliveries.Deliverer(rt, session, job_body)
    gw.poke_deliveries = deliverer.poke

    async def on_app_event(event: AppEventDue, _: Delivery) -> None:
        if await deliveries.fan_out(rt.pool, event):
            deliverer.poke()

    spec = consumer(rt, "gateway-app-events", events.APP_EVENTS, on_app_event, concurrency=8)
    stack.push_async_callback(_stop, rt.watch(bus.consume(rt.js, spec, rt.stop), "app-events-consumer"))
    stack.push_async_callback(_stop, rt.watch(deliverer.run(), "app-webhook-deliveries"))


def _purge_closed_accounts(gw: Gateway, stack: contextlib.AsyncExitStack) -> None:
    """Purge the accounts platforms deleted, once their jobs have ended (purges.py)."""
    purges = Purges(gw.rt, gw.storage, gw.platform_accounts)
    gw.poke_purges = purges.poke
    stack.push_async_callback(_stop, gw.rt.watch(purges.run(), "account-purges"))


async def _closing(app: web.Application) -> None:
    # Shutdown waits for running handlers; open event streams would otherwise hold it for their full life.
    if (gw := app.get(GATEWAY)) is not None:
        gw.closing.set()
        gw.feeds.wake_all()


def create_app(settings: Settings) -> web.Application:
    sealing.keyring(settings)  # without its key the gateway cannot sign a webhook: refused before anything opens
    routes = route_table(settings)
    app = web.Application(
        middlewares=[request_id_middleware, metrics_middleware, error_middleware, call_bound_middleware,
                     auth_middleware],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[PUBLIC_ROUTES] = frozenset(r.name for r in routes if not r.auth)
    app[ROUTE_ACCESS] = {r.name: r.access for r in routes}
    register(app, routes)
    app.cleanup_ctx.append(_resources)
    app.on_shutdown.append(_closing)
    app.on_response_prepare.append(stamp_request_id)
    app.on_response_prepare.append(stamp_rate_limit)
    return app
