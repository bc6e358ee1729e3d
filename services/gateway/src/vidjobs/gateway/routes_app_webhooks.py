"""`/v1/webhook-endpoints`: where an account's app hears of its jobs (services/gateway/appwebhooks/), what
was delivered there and how each attempt went; and `/v1/account/webhook-secret`, the secret that signs the
deliveries to the `webhook_url` a job names for itself. A secret is shown once, in the answer that makes it
(registering an endpoint, rotating its secret, making the account's); rotating keeps the old one signing
beside the new for `overlap_s`, so a receiver can switch without rejecting a delivery."""

from __future__ import annotations

import re

import msgspec
from aiohttp import web

from vidjobs.gateway import cursor
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, not_found
from vidjobs.gateway.appwebhooks import secrets, urls
from vidjobs.gateway.appwebhooks.endpoints import CapReached
from vidjobs.gateway.appwebhooks.history import Retried
from vidjobs.gateway.bodies import (
    DeliveryList,
    DeliveryOut,
    DeliveryQuery,
    EndpointCreated,
    EndpointIn,
    EndpointList,
    EndpointOut,
    RotateSecretIn,
    SecretIssued,
    WebhookSecretOut,
)
from vidjobs.gateway.decoding import read_json, read_optional_json, read_query
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant

ENDPOINT_ID = re.compile(r"^whe_[0-9a-z]{1,64}$")
DELIVERY_ID = re.compile(r"^msg_[0-9a-z]{1,64}$")


def _endpoint_id(request: web.Request) -> str:
    endpoint_id = request.match_info["endpoint_id"]
    if not ENDPOINT_ID.match(endpoint_id):
        raise not_found("webhook endpoint")
    return endpoint_id


async def create_endpoint(request: web.Request) -> web.Response:
    settings = gateway(request).settings
    body = await read_json(request, EndpointIn, settings.max_body_bytes)
    await urls.checked_url(body.url, settings.allowed_webhook_hosts(), "url")
    try:
        endpoint, secret = await tenant(request).add_endpoint(body.url, sorted(set(body.events)), body.description,
                                                              cap=settings.max_webhook_endpoints)
    except CapReached as err:
        raise ApiError(429, GatewayCode.LIMIT_REACHED, str(err)) from err
    created = EndpointCreated(**msgspec.structs.asdict(endpoint), secret=secret)
    return json_response(created, status=201, headers={"Location": f"/v1/webhook-endpoints/{endpoint.id}"})


async def list_endpoints(request: web.Request) -> web.Response:
    found = await tenant(request).endpoints()
    return json_response(EndpointList(data=[msgspec.convert(msgspec.structs.asdict(e), EndpointOut) for e in found]))


async def delete_endpoint(request: web.Request) -> web.Response:
    if not await tenant(request).remove_endpoint(_endpoint_id(request)):
        raise not_found("webhook endpoint")
    return web.Response(status=204)


async def list_deliveries(request: web.Request) -> web.Response:
    query = read_query(request.query, DeliveryQuery)
    before = cursor.decode(query.cursor, cursor.JobPosition) if query.cursor else None
    found = await tenant(request).deliveries(_endpoint_id(request), query.limit + 1,
                                             (before.created_at, before.id) if before else None)
    if found is None:
        raise not_found("webhook endpoint")
    page = found[: query.limit]
    more = len(found) > query.limit
    next_cursor = cursor.encode(cursor.JobPosition(page[-1].created_at, page[-1].id)) if more else None
    return json_response(DeliveryList(data=[msgspec.convert(msgspec.to_builtins(d), DeliveryOut) for d in page],
                                      next_cursor=next_cursor))


async def retry_delivery(request: web.Request) -> web.Response:
    delivery_id, endpoint_id = request.match_info["delivery_id"], _endpoint_id(request)
    if not DELIVERY_ID.match(delivery_id):
        raise not_found("delivery of an enabled webhook endpoint")
    cap = gateway(request).settings.max_webhook_manual_retries
    match await tenant(request).retry_delivery(endpoint_id, delivery_id, cap=cap):
        case Retried.SENT:
            gateway(request).poke_deliveries()
            return web.Response(status=202)
        case Retried.IN_FLIGHT:
            raise ApiError(409, GatewayCode.CONFLICT, "an attempt of this delivery is under way: see its outcome "
                           "in the endpoint's deliveries, then send it again if it still needs to be", retryable=True)
        case Retried.CAPPED:
            raise ApiError(429, GatewayCode.LIMIT_REACHED, f"this delivery was sent again by hand {cap} times, the "
                           "most it may be: check that the endpoint answers 2xx, and fetch the job itself instead")
    raise not_found("delivery of an enabled webhook endpoint")


async def _overlap_s(request: web.Request) -> int:
    body = await read_optional_json(request, RotateSecretIn, gateway(request).settings.max_body_bytes)
    return body.overlap_s


def _shown(issued: secrets.Issued) -> SecretIssued:
    return SecretIssued(secret=issued.secret, created_at=issued.created_at,
                        previous_secret_expires_at=issued.previous_expires_at)


async def rotate_endpoint_secret(request: web.Request) -> web.Response:
    endpoint_id = _endpoint_id(request)
    issued = await tenant(request).rotate_endpoint_secret(endpoint_id, await _overlap_s(request))
    if issued is None:
        raise not_found("webhook endpoint")
    return json_response(_shown(issued))


async def webhook_secret(request: web.Request) -> web.Response:
    held = await tenant(request).webhook_secret_held()
    return json_response(WebhookSecretOut(created_at=held.created_at,
                                          previous_secret_expires_at=held.previous_expires_at))


async def issue_webhook_secret(request: web.Request) -> web.Response:
    issued = await tenant(request).issue_webhook_secret(await _overlap_s(request))
    return json_response(_shown(issued), status=201)


_ONE = "/v1/webhook-endpoints/{endpoint_id}"
_MISSING = {401: ErrorOut, 404: ErrorOut}
_BAD_BODY = {400: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}
ROUTES = [
    Route("POST", "/v1/webhook-endpoints", create_endpoint, "create_webhook_endpoint",
          "Register an endpoint of your app to hear of your jobs; its signing secret is shown this once",
          body=EndpointIn, responses={201: EndpointCreated, 400: ErrorOut, 401: ErrorOut, 413: ErrorOut,
                                      415: ErrorOut, 422: ErrorOut, 429: ErrorOut}),
    Route("GET", "/v1/webhook-endpoints", list_endpoints, "list_webhook_endpoints", "Your webhook endpoints",
          responses={200: EndpointList, 401: ErrorOut}),
    Route("DELETE", _ONE, delete_endpoint, "delete_webhook_endpoint",
          "Remove an endpoint; nothing more is sent to it", responses={204: None, **_MISSING}),
    Route("GET", f"{_ONE}/deliveries", list_deliveries, "list_webhook_deliveries",
          "What was delivered to an endpoint, newest first, with its last attempts; keyset pagination",
          query=DeliveryQuery, responses={200: DeliveryList, 400: ErrorOut, 422: ErrorOut, **_MISSING}),
    Route("POST", f"{_ONE}/deliveries/{{delivery_id}}/retry", retry_delivery, "retry_webhook_delivery",
          "Send a delivery again now", responses={202: None, 409: ErrorOut, 429: ErrorOut, **_MISSING}),
    Route("POST", f"{_ONE}/rotate-secret", rotate_endpoint_secret, "rotate_webhook_endpoint_secret",
          "Replace an endpoint's signing secret, shown this once; the old one signs too for overlap_s",
          body=RotateSecretIn, body_required=False, responses={200: SecretIssued, **_BAD_BODY, **_MISSING}),
    Route("GET", "/v1/account/webhook-secret", webhook_secret, "account_webhook_secret",
          "When the secret that signs deliveries to the webhook_url a job names was made (never the secret)",
          responses={200: WebhookSecretOut, 401: ErrorOut}),
    Route("POST", "/v1/account/webhook-secret", issue_webhook_secret, "issue_account_webhook_secret",
          "Make the secret that signs deliveries to the webhook_url a job names, or replace it (the old one "
          "signs too for overlap_s); shown this once", body=RotateSecretIn, body_required=False,
          responses={201: SecretIssued, 401: ErrorOut, **_BAD_BODY}),
]
