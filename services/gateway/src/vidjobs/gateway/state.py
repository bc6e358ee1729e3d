"""Typed application and request state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from vidjobs.common.estimates import Estimator
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings
from vidjobs.gateway.accounts import Account
from vidjobs.gateway.browsertokens import BrowserToken, Tokens
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.gateway.platform_accounts import PlatformAccounts
from vidjobs.gateway.platformkeys import PlatformKey, PlatformKeys
from vidjobs.gateway.processcaps import Bucket, StreamSlots
from vidjobs.gateway.ratelimit import Buckets
from vidjobs.gateway.routetable import Access
from vidjobs.providers.base import ProviderAdapter
from vidjobs.storage.base import Storage

if TYPE_CHECKING:  # the feeds read through tenants, which reach the gateway's state
    from vidjobs.gateway.feeds import Feeds


@dataclass
class Gateway:
    """Everything a handler needs, opened at startup and closed at cleanup."""

    settings: Settings
    rt: Runtime
    storage: Storage
    adapters: dict[str, ProviderAdapter]
    streams: StreamSlots
    buckets: Buckets  # API keys and their request buckets
    platform_keys: PlatformKeys  # platform keys seen recently
    tokens: Tokens  # browser tokens' grants seen recently
    # Request buckets of platform keys and browser tokens, by key or token id (in this process only).
    credential_rates: dict[str, Bucket]
    webhook_rates: dict[str, Bucket]  # stored callbacks, by provider
    # Waiting jobs' estimated start and ready times, from reads every request and stream of the process shares.
    estimator: Estimator
    # The model routes, read from the database and kept current: a create picks its route from here.
    routes: LiveRoutes
    # Every platform's accounts, scoped to the platform each call names (platform_accounts.py).
    platform_accounts: PlatformAccounts
    feeds: Feeds  # the jobs this process's event streams follow, each read once per change (feeds.py)
    # Set when the server begins shutting down, so long-lived streams end instead of holding it open.
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    # Wakes the delivery of webhooks to apps now rather than at its next look (appwebhooks.deliveries.Deliverer).
    poke_deliveries: Callable[[], None] = lambda: None
    poke_purges: Callable[[], None] = lambda: None  # the purge of deleted accounts looks now (purges.py)


SETTINGS = web.AppKey("settings", Settings)
GATEWAY = web.AppKey("gateway", Gateway)
# The authenticated account; the auth middleware sets it on every protected route. Handlers reach it only
# through `tenant.tenant(request)`, which scopes everything they read or change to it.
ACCOUNT = web.RequestKey("account", Account)
# Which credential made the request: one of the account's API keys, a platform key (acting for it) or a
# browser token, by id; stream slots are counted by it.
API_KEY_ID = web.RequestKey("api_key_id", str)
# Set beside ACCOUNT when a browser token made the request: the jobs it may see, what it may do.
BROWSER_TOKEN = web.RequestKey("browser_token", BrowserToken)
# The account a platform's request made, for its audit line (its id is in no path yet).
AUDITED_ACCOUNT = web.RequestKey("audited_account", str)
# Set when a platform key made the request: on a platform route, or acting for one of its accounts.
PLATFORM_KEY = web.RequestKey("platform_key", PlatformKey)


def gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


# Names of routes under /v1 that need no API key (the provider webhook).
PUBLIC_ROUTES = web.AppKey("public_routes", frozenset[str])
# Who may call each route, by its name (credentials.py).
ROUTE_ACCESS = web.AppKey("route_access", dict[str, Access])
