"""Typed application and request state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from vidjobs.common.estimates import Estimator
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings
from vidjobs.gateway.accounts import Account
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.gateway.processcaps import Bucket, StreamSlots
from vidjobs.gateway.ratelimit import Buckets
from vidjobs.providers.base import ProviderAdapter
from vidjobs.storage.base import Storage


@dataclass
class Gateway:
    """Everything a handler needs, opened at startup and closed at cleanup."""

    settings: Settings
    rt: Runtime
    storage: Storage
    adapters: dict[str, ProviderAdapter]
    streams: StreamSlots
    buckets: Buckets  # API keys and their request buckets
    webhook_rates: dict[str, Bucket]  # stored callbacks, by provider
    # Waiting jobs' estimated start and ready times, from reads every request and stream of the process shares.
    estimator: Estimator
    # The model routes, read from the database and kept current: a create picks its route from here.
    routes: LiveRoutes
    # Set when the server begins shutting down, so long-lived streams end instead of holding it open.
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    # Wakes the delivery of webhooks to apps now rather than at its next look (appwebhooks.deliveries.Deliverer).
    poke_deliveries: Callable[[], None] = lambda: None


SETTINGS = web.AppKey("settings", Settings)
GATEWAY = web.AppKey("gateway", Gateway)
# The authenticated account; the auth middleware sets it on every protected route. Handlers reach it only
# through `tenant.tenant(request)`, which scopes everything they read or change to it.
ACCOUNT = web.RequestKey("account", Account)
API_KEY_ID = web.RequestKey("api_key_id", str)  # which of the account's keys made the request


def gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


# Names of routes under /v1 that need no API key (the provider webhook).
PUBLIC_ROUTES = web.AppKey("public_routes", frozenset[str])
