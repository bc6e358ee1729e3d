"""`POST /v1/webhooks/{provider}`, a provider's callback: verify, parse, check it names a render of ours, store it
in the inbox (raw, and the parsed signal the poller acts on, so a callback is parsed once), answer.
Processing happens elsewhere (the poller reads the inbox), so a slow or failing step never makes a provider
retry a delivery we already hold.

Everything that can refuse a delivery is done before any write, cheapest first: the body's size, the
signature (or, for a provider that signs nothing, the body's shape), the body's meaning, the provider's
rate of stored callbacks, and one indexed read for the render it names. A forged or stray body therefore
costs no row, no stream message and no poller delivery; one that names no render of ours is acknowledged
(so a genuine sender stops retrying) and counted.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import Counter

from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.gateway import inbox
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, not_found
from vidjobs.gateway.bodies import WebhookAck
from vidjobs.gateway.decoding import read_body
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import Gateway, gateway
from vidjobs.providers.base import ProviderAdapter, ProviderSignal

log = logging.getLogger("vidjobs.gateway.callbacks")

# The metric's name predates "callbacks" as the word for what providers send; dashboards read it as it is.
CALLBACKS = Counter("vidjobs_webhooks_total", "Provider callbacks received, by what became of them",
                    ["provider", "outcome"])


def _verified(provider: str, adapter: ProviderAdapter, request: web.Request, raw: bytes) -> str:
    try:
        return adapter.verify_callback(request.headers, raw)
    except WebhookRejected as exc:
        CALLBACKS.labels(provider, "rejected").inc()
        log.warning("callback rejected", extra={"provider": provider, "why": str(exc)})
        raise ApiError(401, GatewayCode.UNAUTHORIZED, "webhook signature could not be verified") from exc


def _parsed(provider: str, adapter: ProviderAdapter, raw: bytes) -> ProviderSignal:
    try:
        return adapter.parse_callback(raw)
    except ProviderError as exc:
        CALLBACKS.labels(provider, "malformed").inc()
        log.warning("callback not understood", extra={"provider": provider, "why": exc.message})
        raise ApiError(400, ErrorCode.INVALID_INPUT, f"not a {provider} callback we understand") from exc


def _within_rate(gw: Gateway, provider: str) -> None:
    wait = gw.webhook_rates[provider].take()
    if wait:
        CALLBACKS.labels(provider, "rate_limited").inc()
        raise ApiError(429, ErrorCode.RATE_LIMITED, f"too many {provider} callbacks; retry in {wait} s",
                       retryable=True, headers={"Retry-After": str(wait)})


async def receive_callback(request: web.Request) -> web.Response:
    gw = gateway(request)
    provider = request.match_info["provider"]
    adapter = gw.adapters.get(provider)
    if adapter is None:
        raise not_found("provider")
    raw = await read_body(request, gw.settings.webhook_max_body_bytes, "callback")
    webhook_id = _verified(provider, adapter, request, raw)
    signal = _parsed(provider, adapter, raw)
    _within_rate(gw, provider)
    async with gw.rt.tx() as conn:
        if not await inbox.is_known(conn, provider, signal):
            CALLBACKS.labels(provider, "unknown_render").inc()
            log.info("callback for no render of ours", extra={"provider": provider,
                                                               "provider_job_id": signal.provider_job_id[:64]})
            return json_response(WebhookAck(received=True, duplicate=False, stored=False))
        stored = await inbox.store(conn, provider, webhook_id, raw, signal)
    CALLBACKS.labels(provider, "stored" if stored else "duplicate").inc()
    return json_response(WebhookAck(received=True, duplicate=not stored))


ROUTES = [
    Route("POST", "/v1/webhooks/{provider}", receive_callback, "receive_webhook",
          "A provider's callback (signed by the provider, not by an API key)", auth=False,
          body="application/json",
          responses={200: WebhookAck, 400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 413: ErrorOut, 429: ErrorOut}),
]
