"""Authorization is one table: every route the gateway serves, against every kind of credential, with the
answer each must get. The table below is written by hand, not read from the routes' own declarations, and
the test walks the app's route table: a route without a row fails it, so no route ships unconsidered.

A row says who may call the route: PUBLIC (anyone), the account's own key (ACCOUNT; a platform key acting
for the account with the `act` scope may too), a browser token with a scope (`read`, `create`, `upload`,
or `any` token), or a platform key with a scope (`""`: any platform key). Every other credential is
refused: 401 when it is no credential we know (none, expired, revoked), 403 when it is live but may not
call the route, and 404 when it may call the route but not for the account or job the path names. An
admitted request may still be refused by what it asks (400, 404, 409, 422...): only 401 and 403 are
authorization's answers, so an admitted request must get neither."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.gateway_harness import JOB_BODY, auth, gateway_settings, running_gateway
from tests.test_platform import ALL_SCOPES, call, grant, signup
from vidjobs.cli import platforms
from vidjobs.gateway import browsertokens
from vidjobs.gateway.state import PUBLIC_ROUTES


@dataclass(frozen=True)
class Row:
    account: bool = False  # the account's key (and a platform acting for it)
    token: str | None = None  # the browser-token scope that admits it ("any": every token)
    platform: str | None = None  # the platform-key scope that admits it ("": every platform key)
    public: bool = False


ACCOUNT = Row(account=True)
PUBLIC = Row(public=True)


def read(**_: Any) -> Row:
    return Row(account=True, token="read")


def platform(scope: str) -> Row:
    return Row(platform=scope)


TABLE: dict[str, Row] = {
    "estimate_job": Row(account=True, token="any"),
    "create_job": Row(account=True, token="create"),
    "list_jobs": read(), "get_job": read(), "job_events": read(), "stream_job": read(),
    "cancel_job": ACCOUNT, "delete_job": ACCOUNT, "rerun_job": ACCOUNT, "keep_job": ACCOUNT, "release_job": ACCOUNT,
    "export_job": ACCOUNT, "list_exports": ACCOUNT, "get_export": ACCOUNT,
    "list_models": Row(account=True, token="any"),
    "create_webhook_endpoint": ACCOUNT, "list_webhook_endpoints": ACCOUNT, "delete_webhook_endpoint": ACCOUNT,
    "list_webhook_deliveries": ACCOUNT, "retry_webhook_delivery": ACCOUNT, "rotate_webhook_endpoint_secret": ACCOUNT,
    "account_webhook_secret": ACCOUNT, "issue_account_webhook_secret": ACCOUNT,
    "create_upload": Row(account=True, token="upload"), "get_upload": Row(account=True, token="upload"),
    "get_account": ACCOUNT, "update_account": ACCOUNT, "get_ledger": ACCOUNT, "get_usage": ACCOUNT,
    "create_account_token": ACCOUNT,
    "get_token": Row(token="any"),  # a token's own grant: for tokens only
    "get_platform": platform(""), "get_platform_audit": platform(""),
    "create_platform_account": platform("accounts"), "list_platform_accounts": platform("accounts"),
    "get_platform_account": platform("accounts"), "update_platform_account": platform("accounts"),
    "disable_platform_account": platform("accounts"), "enable_platform_account": platform("accounts"),
    "delete_platform_account": platform("accounts"), "put_platform_plan": platform("accounts"),
    "list_platform_plans": platform("accounts"),
    "change_platform_account_credit": platform("credits"), "get_platform_account_ledger": platform("credits"),
    "get_platform_account_usage": platform("usage"),
    "create_platform_account_key": platform("keys"), "list_platform_account_keys": platform("keys"),
    "revoke_platform_account_key": platform("keys"),
    "create_platform_account_token": platform("tokens"),
    "receive_webhook": PUBLIC, "healthz": PUBLIC, "readyz": PUBLIC, "metrics": PUBLIC, "page": PUBLIC,
    "page_asset": PUBLIC, "get_file": PUBLIC, "head_file": PUBLIC, "openapi": PUBLIC,
}


@dataclass(frozen=True)
class Credential:
    """One kind of caller: its headers, and what it should be answered on a route of a given row."""

    name: str
    headers: dict[str, str]
    # The answer on a route of this row whose path does (True) or does not name something of account A:
    # "ok" (neither 401 nor 403), "401", "403", "404" or "400".
    expect: Callable[[Row, bool], str]


def _account_key(row: Row, _: bool) -> str:
    return "ok" if row.account else "403"


def _platform(scopes: set[str], acting: bool) -> Callable[[Row, bool], str]:
    def expect(row: Row, _: bool) -> str:
        if row.platform is not None:
            if acting:
                return "400"  # a platform route names its account in its path, never in the header
            return "ok" if row.platform == "" or row.platform in scopes else "403"
        return "ok" if acting and "act" in scopes and row.account else "403"
    return expect


def _token(scopes: set[str], own: bool) -> Callable[[Row, bool], str]:
    def expect(row: Row, names_a: bool) -> str:
        if row.token is None or (row.token != "any" and row.token not in scopes):
            return "403"
        return "404" if names_a and not own else "ok"  # another account's token on this account's ids
    return expect


def _refused(_: Row, __: bool) -> str:
    return "401"


@dataclass
class World:
    ids: dict[str, str]  # path parameter -> a real id of account A (or a name)
    gone: dict[str, str]  # path parameter -> an id that names nothing, for routes that destroy what they name
    credentials: list[Credential]


async def world(h: Any) -> World:
    """Account A, made by a platform, with a job, an upload, an endpoint, a delivery and an export; and every
    kind of credential."""
    async with h.pool.acquire() as conn:
        revoked_id, revoked = await platforms.create(conn, "table-old", ALL_SCOPES)
        await platforms.revoke(conn, revoked_id)
        keys = {scope: (await platforms.create(conn, "table", [scope]))[1] for scope in ALL_SCOPES}
        every = (await platforms.create(conn, "table", ALL_SCOPES))[1]
    a = await signup(h, every, "user-a", requests_per_s=10_000, request_burst=10_000)
    await grant(h, every, a["id"], 10**9, "g")
    acting = {"Vidjobs-Account": a["id"]}
    _, a_key = await call(h, every, "POST", f"/v1/platform/accounts/{a['id']}/keys", {})
    job = (await call(h, a_key["key"], "POST", "/v1/jobs", JOB_BODY))[1]
    resp = await h.client.post("/v1/uploads", data=_png(), headers={**auth(a_key["key"]), "Content-Type": "image/png"})
    upload = await resp.json()
    _, endpoint = await call(h, a_key["key"], "POST", "/v1/webhook-endpoints", {"url": "https://93.184.215.14/x"})
    await h.pool.execute("INSERT INTO webhook_deliveries (id, account_id, endpoint_id, job_id, event_type, event_key, "
                         "url, status) VALUES ('msg_t', $1, $2, $3, 'job.completed', 'k', 'https://x', 'failed')",
                         a["id"], endpoint["id"], job["id"])
    await h.pool.execute("INSERT INTO job_exports (id, job_id, account_id, host) VALUES ('exp_t', $1, $2, 'x')",
                         job["id"], a["id"])
    _, b_key = await h.account(requests_per_s=10_000, request_burst=10_000)
    tokens = {scope: await _mint(h, a_key["key"], [scope]) for scope in ("read", "create", "upload")}
    all_scopes = await _mint(h, a_key["key"], ["read", "create", "upload"])
    theirs = await _mint(h, b_key, ["read", "create", "upload"])
    expired = browsertokens.sign(h.settings, browsertokens.Claims("tok_x", a["id"], 1))
    revoked_token = await _mint(h, a_key["key"], ["read", "create", "upload"])
    _, spare = await call(h, every, "POST", f"/v1/platform/accounts/{a['id']}/keys", {})
    revoked_by_issuer = await _mint(h, spare["key"], ["read", "create", "upload"])
    await call(h, every, "DELETE", f"/v1/platform/accounts/{a['id']}/keys/{spare['id']}")
    await h.pool.execute("UPDATE browser_tokens SET expires_at = now() WHERE id = $1", revoked_token[1])

    bearer = auth
    credentials = [
        Credential("no credential", {}, _refused),
        Credential("unknown key", bearer("vj_" + secrets.token_urlsafe(16)), _refused),
        Credential("account key", bearer(a_key["key"]), _account_key),
        Credential("revoked platform key", bearer(revoked), _refused),
        Credential("platform key, every scope", bearer(every), _platform(set(ALL_SCOPES), acting=False)),
        Credential("platform key acting for A", {**bearer(every), **acting}, _platform(set(ALL_SCOPES), acting=True)),
        *[Credential(f"platform key, {scope} only", bearer(key), _platform({scope}, acting=False))
          for scope, key in keys.items()],
        *[Credential(f"platform key, {scope} only, acting for A", {**bearer(key), **acting},
                     _platform({scope}, acting=True)) for scope, key in keys.items()],
        *[Credential(f"token of A, {scope} only", bearer(token), _token({scope}, own=True))
          for scope, (token, _) in tokens.items()],
        Credential("token of A, every scope", bearer(all_scopes[0]), _token({"read", "create", "upload"}, own=True)),
        Credential("token of B, every scope", bearer(theirs[0]), _token({"read", "create", "upload"}, own=False)),
        Credential("expired token", bearer(expired), _refused),
        Credential("token past its row's expiry", bearer(revoked_token[0]), _refused),
        Credential("token whose issuer's key is revoked", bearer(revoked_by_issuer[0]), _refused),
    ]
    ids = {"job_id": job["id"], "upload_id": upload["id"], "endpoint_id": endpoint["id"], "delivery_id": "msg_t",
           "export_id": "exp_t", "account_id": a["id"], "key_id": a_key["id"], "plan": "gold"}
    gone = {**ids, "job_id": "job_0000000000gone", "endpoint_id": "whe_gone", "account_id": "acct_gone",
            "key_id": "key_gone"}
    return World(ids=ids, gone=gone, credentials=credentials)


async def _mint(h: Any, key: str, scopes: list[str]) -> tuple[str, str]:
    status, minted = await call(h, key, "POST", "/v1/account/tokens", {"scopes": scopes})
    assert status == 201, minted
    return minted["token"], minted["id"]


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")
# Routes that destroy what they name are asked about an id that names nothing: what is checked is whether the
# caller was let in, and a row removed by one caller would change what the next one is answered.
DESTROYS = {"delete_job", "delete_webhook_endpoint", "delete_platform_account", "revoke_platform_account_key",
            "disable_platform_account"}


def _answer_class(status: int) -> str:
    return str(status) if status in (400, 401, 403, 404) else "ok"


def _matches(expected: str, status: int) -> bool:
    if expected == "ok":
        return status not in (401, 403)
    if expected == "404":
        return status in (404,)
    return status == int(expected)


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, platform_rate_per_s=10_000.0,
                                platform_rate_burst=10_000)
    async with running_gateway(settings) as harness:
        yield harness


async def test_every_route_has_a_row_and_every_credential_gets_the_rows_answer(h):
    routes = [r for r in h.app.router.routes() if r.resource is not None and r.name is not None]
    names = {r.name for r in routes}
    assert names == set(TABLE), (f"routes without a row: {sorted(names - set(TABLE))}; "
                                 f"rows without a route: {sorted(set(TABLE) - names)}")
    assert {n for n, row in TABLE.items() if row.public} == set(h.app[PUBLIC_ROUTES])

    w = await world(h)
    cells, wrong = 0, []
    for route in sorted((r for r in routes if not TABLE[r.name].public and r.method != "HEAD"), key=lambda r: r.name):
        ids = w.gone if route.name in DESTROYS else w.ids
        path = PARAM.sub(lambda m, ids=ids: ids[m[1]], route.resource.canonical)
        for credential in w.credentials:
            expected = credential.expect(TABLE[route.name], bool(PARAM.search(route.resource.canonical)))
            status = await _status(h, route.method, path, credential.headers)
            cells += 1
            if not _matches(expected, status):
                wrong.append(f"{route.method} {route.resource.canonical} as {credential.name}: "
                             f"expected {expected}, got {status}")
    print(f"authorization table: {len(TABLE)} routes x {len(w.credentials)} credentials = {cells} checks")
    assert not wrong, f"{len(wrong)} of {cells} answers are wrong:\n" + "\n".join(wrong)


async def _status(h: Any, method: str, path: str, headers: dict[str, str]) -> int:
    # An empty JSON object: enough to pass the body's content type, too little for any create to act on.
    body = {} if method in ("POST", "PATCH", "PUT") else None
    async with h.client.request(method, path, json=body, headers=headers) as resp:
        status = resp.status
    await asyncio.sleep(0)
    return status
