"""Tenancy: an account sees and changes only its own data, on every route.

Two kinds of proof. A structural one: handler modules cannot reach the database except through the caller's
`Tenant` (vidjobs.gateway.tenant), whose every query names the caller's account, so a forgotten check
has nowhere to hide. And a behavioural one: every route of the app's own route table that takes an id,
called with another account's key on this account's real ids, answers exactly as for an id that never
existed, and changes nothing.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import vidjobs.gateway
from tests.gateway_harness import JOB_BODY, assert_error, auth, gateway_settings, running_gateway
from tests.imagefiles import png_with_text
from vidjobs.gateway.state import PUBLIC_ROUTES, ROUTE_ACCESS

GATEWAY_DIR = Path(vidjobs.gateway.__file__).parent

# Route modules that act for no account, and so have no Tenant. Each is named with the reason.
EXEMPT = {
    # Providers call it, signed by the provider instead of an API key; it stores the callback in the webhook
    # inbox, which belongs to no account (the poller matches it to a job later).
    "routes_callbacks.py",
    # Liveness, readiness and metrics: the readiness probe asks the database `SELECT 1`, on nobody's behalf.
    "routes_ops.py",
    # Serves stored objects to whoever holds an unexpired signed URL: the signature is the permission, and
    # no database is read.
    "routes_files.py",
}

# Attributes that mean "talking to the database directly".
DB_ATTRIBUTES = {"pool", "fetch", "fetchrow", "fetchval", "fetchmany", "execute", "executemany", "acquire",
                 "transaction", "copy_records_to_table", "copy_to_table"}
# Data functions that take an account id (or none) from their caller: only the Tenant may call them, with
# its own. Named by where they are defined; any import or attribute path that reaches them is caught.
UNSCOPED = {
    "vidjobs.common.jobs.fetch", "vidjobs.common.deletion.soft_delete", "vidjobs.common.uploads.owned",
    "vidjobs.gateway.intake.insert", "vidjobs.common.credits.entries", "vidjobs.common.credits.committed_on",
    "vidjobs.common.transitions.transition", "vidjobs.gateway.accounts.fetch", "vidjobs.gateway.accounts.by_key",
    "vidjobs.gateway.accounts.active_jobs", "vidjobs.gateway.state.ACCOUNT", "vidjobs.gateway.store",
}


def handler_modules() -> list[Path]:
    return sorted(GATEWAY_DIR.glob("routes_*.py")) + [GATEWAY_DIR / "stream.py"]


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted path it was imported as."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _reaches(path: str) -> str | None:
    return next((bad for bad in UNSCOPED if path == bad or path.startswith(bad + ".")), None)


def violations(source: str, filename: str = "<module>") -> list[str]:
    """What in `source` reaches the database or an unscoped data function, one line each."""
    tree = ast.parse(source, filename)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{where}: imports {bad}" for a in node.names
                      if (bad := _reaches(f"{node.module}.{a.name}"))]
        elif isinstance(node, ast.Import):
            found += [f"{where}: imports {bad}" for a in node.names if (bad := _reaches(a.name))]
        elif isinstance(node, ast.Attribute):
            if node.attr in DB_ATTRIBUTES:
                found.append(f"{where}: uses .{node.attr}")
            elif node.attr == "tx" and (isinstance(node.value, ast.Attribute) and node.value.attr == "rt"
                                        or isinstance(node.value, ast.Name) and node.value.id == "rt"):
                found.append(f"{where}: opens a transaction with rt.tx")
            elif (path := _dotted(node, aliases)) and (bad := _reaches(path)):
                found.append(f"{where}: uses {bad}")
        elif isinstance(node, ast.Name) and node.id in aliases and (bad := _reaches(aliases[node.id])):
            found.append(f"{where}: uses {bad}")
    return sorted(set(found))


def test_the_check_catches_each_way_around_the_tenant():
    planted = """
from vidjobs.common import deletion, uploads as up
from vidjobs.common.jobs import fetch
import vidjobs.common.credits
from vidjobs.gateway.state import ACCOUNT

async def handler(request):
    gw = gateway(request)
    await gw.rt.pool.fetchrow("SELECT * FROM jobs")
    async with gw.rt.tx() as conn:
        await conn.execute("DELETE FROM jobs")
    await deletion.soft_delete(conn, "job_1", request[ACCOUNT].id)
    await up.owned(None, "acct", "upl_1")
    await vidjobs.common.credits.entries(None, "acct")
"""
    found = "\n".join(violations(planted))
    for expected in [".pool", ".fetchrow", "rt.tx", ".execute", "vidjobs.common.jobs.fetch", "deletion.soft_delete",
                     "uploads.owned", "credits.entries", "state.ACCOUNT"]:
        assert expected in found, (expected, found)
    program = "from vidjobs.common.jobs import JobRequest\nasync def h(t):\n    return await t.job('x')\n"
    assert violations(program) == []


def test_handlers_reach_data_only_through_their_tenant():
    modules = handler_modules()
    names = {path.name for path in modules}
    assert EXEMPT <= names, f"exempt modules that no longer exist: {EXEMPT - names}"
    assert {"routes_jobs.py", "routes_account.py", "routes_uploads.py", "stream.py"} <= names
    found = []
    for path in modules:
        if path.name not in EXEMPT:
            found += violations(path.read_text(), path.name)
    assert found == [], "handlers must go through tenant(request):\n" + "\n".join(found)


def test_the_store_module_is_gone():
    assert not (GATEWAY_DIR / "store.py").exists()


# ---- behaviour -------------------------------------------------------------------------------------------

PARAM = re.compile(r"\{(\w+)\}")
MISSING = {"job_id": "job_" + "0" * 26, "upload_id": "upl_" + "0" * 26, "endpoint_id": "whe_" + "0" * 26,
           "delivery_id": "msg_" + "0" * 26, "export_id": "exp_" + "0" * 26}
READ_ONLY = ["status", "cost", "account_id", "account", "id", "estimated_credits", "actual_credits", "attempt",
             "outputs"]


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


def tenant_routes(h) -> list[tuple[str, str]]:
    """(method, path template) of every route the app serves behind an API key (the platform's routes are
    tests/test_platform.py's and tests/test_authorization.py's)."""
    public, access = h.app[PUBLIC_ROUTES], h.app[ROUTE_ACCESS]
    return [(r.method, r.resource.canonical) for r in h.app.router.routes()
            if r.resource is not None and r.name not in public and r.method != "HEAD"
            and access[r.name].platform_scope is None and access[r.name].account]


async def call(h, key: str, method: str, path: str) -> tuple[int, str]:
    """The status and body, with the body's request id (every request's own) taken out."""
    resp = await h.client.request(method, path, headers=auth(key))
    return resp.status, (await resp.text()).replace(resp.headers["X-Request-Id"], "<request id>")


async def test_another_accounts_ids_answer_like_missing_ones_on_every_route(h):
    a_id, a_key = await h.account()
    _, b_key = await h.account()
    _, job = await h.post_job(a_key)
    resp = await h.client.post("/v1/uploads", data=png_with_text(), headers={**auth(a_key),
                                                                             "Content-Type": "image/png"})
    assert resp.status == 201
    upload_id = (await resp.json())["id"]
    # A public address written out, so no name needs resolving here.
    resp = await h.client.post("/v1/webhook-endpoints", json={"url": "https://93.184.215.14/hook"},
                               headers=auth(a_key))
    assert resp.status == 201, await resp.text()
    endpoint_id = (await resp.json())["id"]
    await h.pool.execute("INSERT INTO webhook_deliveries (id, account_id, endpoint_id, job_id, event_type, event_key, "
                         "url, status) VALUES ('msg_a', $1, $2, $3, 'job.completed', 'k', 'https://x', 'failed')",
                         a_id, endpoint_id, job["id"])
    await h.pool.execute("INSERT INTO job_exports (id, job_id, account_id, host) VALUES ('exp_a', $1, $2, 'x')",
                         job["id"], a_id)
    a_ids = {"job_id": job["id"], "upload_id": upload_id, "endpoint_id": endpoint_id, "delivery_id": "msg_a",
             "export_id": "exp_a"}

    with_ids = [(m, p) for m, p in tenant_routes(h) if PARAM.search(p)]
    assert ("GET", "/v1/jobs/{job_id}") in with_ids and ("DELETE", "/v1/jobs/{job_id}") in with_ids
    for method, template in with_ids:
        unknown = set(PARAM.findall(template)) - a_ids.keys()
        assert not unknown, f"{method} {template}: give this test a real id of account A for {unknown}"
        theirs = await call(h, b_key, method, PARAM.sub(lambda m: a_ids[m[1]], template))
        missing = await call(h, b_key, method, PARAM.sub(lambda m: MISSING[m[1]], template))
        assert theirs[0] == 404, (method, template, theirs)
        assert theirs == missing, (method, template)

    # Nothing B did touched A's job.
    row = await h.pool.fetchrow("SELECT status, deleted_at FROM jobs WHERE id = $1", job["id"])
    assert (row["status"], row["deleted_at"]) == ("pending", None)
    status, still = await h.get(a_key, f"/v1/jobs/{job['id']}")
    assert status == 200 and still["status"] == "pending"
    assert await h.count("SELECT count(*) FROM job_transitions WHERE job_id = $1", job["id"]) == 1
    assert await h.count("SELECT credits_reserved FROM accounts WHERE id = $1", a_id) == job["cost"][
        "estimated_credits"]


async def test_another_accounts_upload_cannot_be_named(h):
    _, a_key = await h.account()
    _, b_key = await h.account()
    resp = await h.client.post("/v1/uploads", data=png_with_text(), headers={**auth(a_key),
                                                                             "Content-Type": "image/png"})
    upload_id = (await resp.json())["id"]

    theirs = await h.post_job(b_key, input_image=upload_id)
    missing = await h.post_job(b_key, input_image=MISSING["upload_id"])

    assert theirs[0] == missing[0] == 422
    # The same answer, but for the id each request named.
    assert theirs[1]["error"]["message"].replace(upload_id, "?") == \
        missing[1]["error"]["message"].replace(MISSING["upload_id"], "?")
    assert await h.count("SELECT count(*) FROM jobs") == 0


async def test_reads_without_an_id_show_only_the_callers_data(h):
    a_id, a_key = await h.account()
    b_id, b_key = await h.account()
    a_jobs = [(await h.post_job(a_key))[1]["id"] for _ in range(2)]
    b_job = (await h.post_job(b_key))[1]["id"]

    reads = [p for m, p in tenant_routes(h) if m == "GET" and not PARAM.search(p)]
    assert {"/v1/jobs", "/v1/account", "/v1/account/ledger"} <= set(reads)
    for path in reads:
        status, text = await call(h, b_key, "GET", path)
        assert status == 200, (path, text)
        for foreign in [a_id, *a_jobs]:
            assert foreign not in text, (path, foreign)

    _, listed = await h.get(b_key, "/v1/jobs")
    assert [j["id"] for j in listed["data"]] == [b_job]
    _, account = await h.get(b_key, "/v1/account")
    assert account["id"] == b_id and account["active_jobs"] == 1 and account["credits"]["reserved"] == 50
    _, ledger = await h.get(b_key, "/v1/account/ledger")
    assert {e["job_id"] for e in ledger["data"]} == {None, b_job}


@pytest.mark.parametrize("field", READ_ONLY)
async def test_read_only_fields_cannot_be_set(h, field):
    account_id, key = await h.account(credits=1000)
    body = {**JOB_BODY, field: {"estimated_credits": 0} if field in ("cost", "outputs") else "x"}

    status, answer = await h.post_job(key, json.loads(json.dumps(body)))

    assert status == 422, answer
    assert_error(answer, "invalid_input", field)
    assert await h.count("SELECT count(*) FROM jobs") == 0
    assert await h.count("SELECT credits_reserved FROM accounts WHERE id = $1", account_id) == 0
    assert await h.count("SELECT count(*) FROM credit_ledger WHERE kind = 'reserve'") == 0
