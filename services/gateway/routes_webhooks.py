"""`POST /v1/webhooks/{provider}`: verify, store raw in the inbox, answer. Processing happens elsewhere (the
poller reads the inbox), so a slow or failing step never makes a provider retry a delivery we already hold."""

from __future__ import annotations

import logging

from aiohttp import web

from libs.common import outbox
from libs.common.errors import WebhookRejected
from libs.common.events import InboxReceived
from services.gateway.bodies import WebhookAck
from services.gateway.decoding import read_body
from services.gateway.errors import ApiError, ErrorOut, GatewayCode, not_found
from services.gateway.routing import Route, json_response
from services.gateway.state import gateway

log = logging.getLogger("vidjobs.gateway.webhooks")


async def receive_webhook(request: web.Request) -> web.Response:
    gw = gateway(request)
    provider = request.match_info["provider"]
    adapter = gw.adapters.get(provider)
    if adapter is None:
        raise not_found("provider")
    raw = await read_body(request, gw.settings.max_body_bytes)
    try:
        webhook_id = adapter.verify_callback(request.headers, raw)
    except WebhookRejected as exc:
        log.warning("webhook rejected", extra={"provider": provider, "why": str(exc)})
        raise ApiError(401, GatewayCode.UNAUTHORIZED, "webhook signature could not be verified") from exc
    async with gw.rt.tx() as conn:
        inbox_id = await conn.fetchval(
            """
            INSERT INTO webhook_inbox (provider, webhook_id, payload) VALUES ($1, $2, $3)
            ON CONFLICT (provider, webhook_id) DO NOTHING
            RETURNING id
            """,
            provider, webhook_id, raw,
        )
        if inbox_id is not None:
            await outbox.add(conn, [InboxReceived(inbox_id=inbox_id, provider=provider)])
    return json_response(WebhookAck(received=True, duplicate=inbox_id is None))


ROUTES = [
    Route("POST", "/v1/webhooks/{provider}", receive_webhook, "receive_webhook",
          "A provider's callback (signed by the provider, not by an API key)", auth=False,
          body="application/json", responses={200: WebhookAck, 401: ErrorOut, 404: ErrorOut, 413: ErrorOut}),
]
