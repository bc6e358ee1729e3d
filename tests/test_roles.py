"""One PostgreSQL role per service (vidjobs.common.grants): the declaration against the SQL each service's code
contains, the database against the declaration, a service's reach into another's tables only through the
owner's interfaces (views and functions), and the whole lifecycle with every service connecting as a login
user of its own role, so a statement its grants do not cover is refused by PostgreSQL itself. The lifecycle
and the refusals run on what this release's code needs alone (grants.NEEDED), as the next release will hold
it, without what the release before still uses (grants.FOR_THE_RELEASE_BEFORE).
tests/test_privileges.py shows what else the roles are refused."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests import imagefiles, sqlscan
from tests.faults.servicelogs import LoggingSupervisor
from tests.sqlscan import ROOT
from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from tests.test_app_webhooks import client_app
from vidjobs.common import db, grants
from vidjobs.common.errors import ConfigError
from vidjobs.common.grants import (
    FOR_THE_RELEASE_BEFORE,
    GRANTS,
    INTERFACES,
    NEEDED,
    OPERATOR_ONLY,
    OWNERS,
    SERVICES,
    UNMEDIATED,
    Column,
    Grant,
    Privilege,
    privilege_of,
)
from vidjobs.common.runtime import migrate_database, open_runtime

# Statements a service's imports bring along that the service never runs, so its role need not cover them.
REACHABLE_NOT_RUN: dict[str, dict[tuple[str, Privilege], str]] = {
    service: {
        ("reserve_job_credit", Privilege.EXECUTE): "vidjobs.common.credits: reserving is part of creating a job",
        ("credit_ledger", Privilege.SELECT): "vidjobs.common.credits: the ledger is read by the gateway (entries)",
        ("account_daily_spend", Privilege.SELECT): "vidjobs.common.credits: the gateway shows the day's spend",
    }
    for service in SERVICES if service != "gateway"
}
REACHABLE_NOT_RUN["gateway"] = {
    ("provider_breakers", Privilege.INSERT): "vidjobs.common.breakers: the gateway's estimates only read "
                                             "whether a breaker holds jobs back (breakers.pausing_sql)",
    ("provider_breakers", Privilege.UPDATE): "vidjobs.common.breakers: opening and closing is the submitter's",
    ("attempt_costs", Privilege.INSERT): "vidjobs.common.attempt_costs: the gateway reads what attempts were "
                                         "billed (billed_sql); recording a bill is the poller's (record)",
    ("attempt_costs", Privilege.UPDATE): "vidjobs.common.attempt_costs: recording a bill is the poller's",
}
REACHABLE_NOT_RUN["media"] |= {
    ("job_files", Privilege.SELECT): "vidjobs.common.renders: the view is what the media service keeps for the "
                                     "gateway (outputs_sql); it reads its own assets table",
}


def _pairs(uses: dict[str, frozenset[Grant]] | dict[str, dict[Privilege, set[str]]]) -> set[tuple[str, Privilege]]:
    """(table or function, privilege): a privilege on some of a table's columns counts as one on the table here;
    which columns is checked by the test after."""
    return {(name, privilege_of(grant)) for name, granted in uses.items() for grant in granted}


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_is_granted_exactly_what_its_sql_needs(service):
    found = sqlscan.uses_of(service)
    needed = _pairs(found) - OPERATOR_ONLY
    declared = _pairs(NEEDED[service])

    not_granted = needed - declared
    unused = declared - needed

    where = {f"{t} {p.value}": sorted(found[t][p]) for t, p in not_granted}
    assert not_granted == set(REACHABLE_NOT_RUN.get(service, {})), f"needed but not granted: {where}"
    assert not unused, f"granted but no statement of {service} needs it: {sorted(unused)}"


@pytest.mark.parametrize("service", SERVICES)
def test_a_column_grant_covers_exactly_the_columns_a_service_names(service):
    for table, granted in NEEDED[service].items():
        readable = {g.name for g in granted if isinstance(g, Column) and g.privilege is Privilege.SELECT}
        if Privilege.SELECT in granted or not readable:
            continue
        named = sqlscan.named_columns(service, table)
        assert set(named) == readable, f"{table}: granted {sorted(readable)}, named {named}"


def _others(service: str, name: str) -> bool:
    """Whether `name` is a table another service owns."""
    return OWNERS.get(name) in SERVICES and OWNERS[name] != service


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_reaches_another_services_tables_only_through_the_owners_interfaces(service):
    needs = {name: granted for name, granted in NEEDED[service].items()}
    direct = {name for name in needs if _others(service, name)}
    undeclared = sorted(name for name in needs if name not in OWNERS and name not in INTERFACES)

    assert direct == {name for s, name in UNMEDIATED if s == service}, "a table of another service, named directly"
    assert not undeclared, f"views or functions with no owner in grants.INTERFACES: {undeclared}"


def test_every_interface_is_in_the_schema_and_every_view_is_an_interface():
    views, functions = sqlscan.schema_views(), sqlscan.schema_functions()
    assert set(INTERFACES) <= views | functions, set(INTERFACES) - views - functions
    assert views <= set(INTERFACES), views - set(INTERFACES)
    assert set(INTERFACES.values()) <= {*SERVICES, "common", "operator"}
    assert {"job_files", "live_uploads"} <= views


@pytest.mark.parametrize("service", SERVICES)
def test_what_the_release_before_still_uses_is_granted_and_needed_by_nothing_here(service):
    kept = _pairs(FOR_THE_RELEASE_BEFORE.get(service, {}))
    needed = _pairs(sqlscan.uses_of(service))

    assert not kept & needed, f"this release's code still uses {sorted(kept & needed)}"
    assert kept <= _pairs(GRANTS[service]) and _pairs(NEEDED[service]) <= _pairs(GRANTS[service])
    assert all(_others(service, name) for name, _ in kept), "only another service's table is kept for a rollout"


def test_the_scan_sees_what_a_statement_needs():
    tables = {"jobs", "accounts", "outbox", "credit_ledger"}
    claim = "SELECT id FROM outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
    move = "UPDATE jobs SET status = $2 FROM accounts a WHERE jobs.id = $1 RETURNING jobs.id"
    entry = "INSERT INTO credit_ledger (account_id) SELECT id FROM accounts RETURNING *"

    assert sqlscan.statement_uses(claim, tables) == {"outbox": {Privilege.SELECT, Privilege.UPDATE}}
    assert sqlscan.statement_uses(move, tables) == {"jobs": {Privilege.SELECT, Privilege.UPDATE},
                                                    "accounts": {Privilege.SELECT}}
    assert sqlscan.statement_uses(entry, tables) == {"credit_ledger": {Privilege.INSERT, Privilege.SELECT},
                                                     "accounts": {Privilege.SELECT}}
    settle = "SELECT * FROM settle_job_credit($1, $2)"
    assert sqlscan.statement_uses(settle, tables, {"settle_job_credit"}) == {"settle_job_credit": {Privilege.EXECUTE}}
    cap = "SELECT a.concurrent_jobs FROM jobs j JOIN accounts a ON a.id = j.account_id WHERE j.id = $1"
    assert sqlscan.statement_columns(cap, "accounts") == {"concurrent_jobs", "id"}
    assert sqlscan.statement_columns("SELECT * FROM accounts WHERE id = $1", "accounts") == {"*"}


async def test_every_table_has_an_owner_and_the_roles_hold_the_declaration(database_url):
    conn = await asyncpg.connect(database_url)
    try:
        tables = {r["relname"] for r in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace")}
        held = await grants.held(conn)
        in_step = await grants.in_step(conn)
    finally:
        await conn.close()

    assert set(OWNERS) == tables == sqlscan.schema_tables()
    assert held == GRANTS and in_step


@pytest.fixture
async def logins(database_url) -> AsyncIterator[dict[str, str]]:
    """A login user per service, member of its role (as a deployment makes them), and the URL each connects
    with. Roles belong to the whole server, so the names are this test's own."""
    suffix = secrets.token_hex(3)
    users = {service: f"vjt_{service}_{suffix}" for service in SERVICES}
    admin = await asyncpg.connect(database_url)
    try:
        for service, user in users.items():
            await admin.execute(f'CREATE ROLE "{user}" LOGIN IN ROLE {grants.role(service)}')
        yield {service: _as_user(database_url, user) for service, user in users.items()}
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE usename = ANY($1::text[])", list(users.values()))
        for user in users.values():
            await admin.execute(f'DROP ROLE IF EXISTS "{user}"')
        await admin.close()


def _as_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))


async def test_a_service_role_is_refused_what_it_was_not_granted(logins):
    media = await asyncpg.connect(logins["media"])
    try:
        refused = []
        for statement in ("SELECT key_hash FROM api_keys", "DELETE FROM jobs", "INSERT INTO poll_schedule VALUES ('x')",
                          "UPDATE provider_submissions SET answered_at = now()", "CREATE TABLE mine (id int)",
                          "DROP TABLE assets"):
            with pytest.raises((asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedTableError)) as caught:
                await media.execute(statement)
            refused.append(type(caught.value))
        allowed = await media.fetchval("SELECT count(*) FROM assets")
    finally:
        await media.close()

    assert refused == [asyncpg.InsufficientPrivilegeError] * 6 and allowed == 0
    # A service on its own role starts on a current schema without changing anything.
    assert await db.migrate(logins["gateway"]) == []


async def _next_release(conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The roles as the next release leaves them: what this release's code needs, and nothing the release
    before still uses (it is gone by then). Anything in this process that migrates applies the same."""
    monkeypatch.setattr(grants, "GRANTS", NEEDED)
    await grants.apply(conn)


async def _as(conn: asyncpg.Connection, service: str, statement: str) -> object:
    """What `statement` answers run as the service's role, or the type of the error it raised."""
    await conn.execute(f"SET ROLE {grants.role(service)}")
    try:
        return await conn.fetchval(statement)
    except asyncpg.PostgresError as exc:
        return type(exc)
    finally:
        await conn.execute("RESET ROLE")


_FIRST_COLUMN = ("SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped "
                 "ORDER BY attnum LIMIT 1")


async def _attempts_on_others_tables(conn: asyncpg.Connection) -> dict[str, object]:
    """Every read and every write of a table another service owns that the service's code does not need,
    tried as the service's role: `service: statement` -> what it answered."""
    answers = {}
    for service in SERVICES:
        for table in sorted(t for t in OWNERS if _others(service, t)):
            held = {privilege_of(g) for g in NEEDED[service].get(table, ())}
            column = await conn.fetchval(_FIRST_COLUMN, table)
            for privilege, statement in ((Privilege.SELECT, f"SELECT count(*) FROM {table}"),
                                         (Privilege.UPDATE, f'UPDATE {table} SET "{column}" = "{column}" WHERE false')):
                if privilege not in held:
                    answers[f"{service}: {statement}"] = await _as(conn, service, statement)
    return answers


# What each service calls of another's interfaces (all answer on an empty schema), and calls it is refused.
_THROUGH = {
    ("gateway", "SELECT count(*) FROM job_files"): 0,
    ("submitter", "SELECT count(*) FROM live_uploads"): 0,
    ("media", "SELECT count(*) FROM live_uploads"): 0,
    ("media", "SELECT mark_upload_ready('upl_none', 1, repeat('0', 64), 1, 1)"): False,
    ("media", "SELECT mark_upload_rejected('upl_none', 'image_corrupt', 'no')"): False,
    ("reaper", "SELECT expire_unused_uploads(86400, 10)"): 0,
    ("reaper", "SELECT reject_unprocessed_uploads(86400, 10)"): 0,
    ("submitter", "SELECT expire_unused_uploads(0, 1000)"): asyncpg.InsufficientPrivilegeError,
    ("reaper", "SELECT mark_upload_ready('upl_none', 1, repeat('0', 64), 1, 1)"): asyncpg.InsufficientPrivilegeError,
    ("gateway", "SELECT count(*) FROM assets"): asyncpg.InsufficientPrivilegeError,
}


async def test_another_services_tables_are_refused_to_a_role_but_through_the_owners_interfaces(database_url,
                                                                                               monkeypatch):
    admin = await asyncpg.connect(database_url)
    try:
        # During this release's rollout the release before still reads media's assets as the gateway, directly.
        rollout = await _as(admin, "gateway", "SELECT count(*) FROM assets")
        await _next_release(admin, monkeypatch)
        attempts = await _attempts_on_others_tables(admin)
        through = {call: await _as(admin, *call) for call in _THROUGH}
    finally:
        await admin.close()

    assert rollout == 0
    refused = {call: answer for call, answer in attempts.items() if answer is asyncpg.InsufficientPrivilegeError}
    assert refused == attempts, {call: answer for call, answer in attempts.items() if call not in refused}
    assert {"gateway: SELECT count(*) FROM assets", "reaper: UPDATE uploads SET \"id\" = \"id\" WHERE false",
            "media: SELECT count(*) FROM uploads", "submitter: SELECT count(*) FROM uploads"} <= set(refused)
    assert len(refused) > 100  # five services, each refused reads and writes of a score of other tables
    assert through == _THROUGH


async def test_a_service_role_cannot_apply_pending_migrations(logins, empty_database_url):
    empty = _as_user(empty_database_url, urlsplit(logins["gateway"]).username or "")
    with pytest.raises(ConfigError, match="vidjobs migrate"):
        await db.migrate(empty)


async def test_opening_a_runtime_changes_no_schema(tmp_path, empty_database_url, nats_url):
    """The schema's owner opens a runtime on an empty database: it is refused, naming the command that
    migrates, and the database is left as it was; once `migrate_database` has run, it opens."""
    settings = stack_settings(tmp_path, empty_database_url, nats_url)
    with pytest.raises(ConfigError, match="vidjobs migrate"):
        async with open_runtime("test", settings):
            pass
    conn = await asyncpg.connect(empty_database_url)
    try:
        untouched = await db.schema(conn)
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    assert (untouched.applied, tables) == ([], 0)

    applied = await migrate_database(settings)
    async with open_runtime("test", settings) as rt, rt.pool.acquire() as conn:
        current = await db.schema(db.lent(conn))
    assert applied and current.current


async def test_the_lifecycle_runs_with_every_service_on_its_own_role(tmp_path, database_url, nats_url, logins,
                                                                   monkeypatch):
    admin = await asyncpg.connect(database_url)
    try:
        await _next_release(admin, monkeypatch)  # no pod of this release needs what the release before used
    finally:
        await admin.close()
    async with client_app() as (app, port):
        settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1,
                                  retention_days=3 / 86400, retention_sweep_interval_s=0.5,
                                  webhook_allow_hosts=f"127.0.0.1:{port}", app_webhook_retry_s="0.3")
        env_for = {service: {"VIDJOBS_DATABASE_URL": url} for service, url in logins.items()}
        log_dir = tmp_path / "logs"

        def supervisor(env: dict[str, str], **options) -> LoggingSupervisor:
            return LoggingSupervisor(env, log_dir=log_dir, env_for=env_for, **options)

        async with running_stack(settings, supervisor_factory=supervisor) as stack:
            async with stack.session.post(f"{stack.url}/v1/webhook-endpoints", headers=stack.auth,
                                          json={"url": f"http://127.0.0.1:{port}/hooks/app"}) as resp:
                assert resp.status == 201, await resp.text()
            # Taken by the gateway, decoded by the media worker: each on its own role.
            upload_id = (await stack.ready_upload(imagefiles.noise_png(64)))["id"]
            jobs = {
                "callback": await stack.create_job(input_image=upload_id, params={"render_s": 0.2}),
                "polled": await stack.create_job(model="fake-poll/default", params={"render_s": 0.5}),
                "recovered": await stack.create_job(params={"scenario": "no_callback", "render_s": 0.3}),
                "rejected": await stack.create_job(params={"scenario": "content_rejected", "render_s": 0.1}),
                "canceled": await stack.create_job(params={"scenario": "hang"}),
            }
            await stack.wait_for_status(jobs["canceled"]["id"], "submitted", "processing")
            async with stack.session.post(f"{stack.url}/v1/jobs/{jobs['canceled']['id']}/cancel",
                                          headers=stack.auth) as resp:
                assert resp.status in (200, 202), await resp.text()
            finals = {name: await stack.wait_terminal(job["id"]) for name, job in jobs.items()}
            sessions = await _sessions(database_url)
            # Retention (reaper) then removal of the originals (media), then a delete.
            expired = await stack.wait_for_status(jobs["callback"]["id"], "expired", within=30)
            async with stack.session.delete(f"{stack.url}/v1/jobs/{jobs['polled']['id']}",
                                            headers=stack.auth) as resp:
                assert resp.status == 204
            await wait_until(lambda: _delivered(app), within=30, what="the app's webhook")
            async with stack.session.get(f"{stack.url}/v1/account/ledger", headers=stack.auth) as resp:
                assert resp.status == 200
                ledger = (await resp.json())["data"]
            restarts = {name: stack.supervisor.starts.get(name) for name in SERVICES}

    assert {name: job["status"] for name, job in finals.items()} == {
        "callback": "completed", "polled": "completed", "recovered": "completed", "rejected": "failed",
        "canceled": "canceled"}
    assert expired["status"] == "expired"
    assert {kind["kind"] for kind in ledger} >= {"reserve", "release", "charge"}
    assert restarts == dict.fromkeys(SERVICES, 1)
    # Each service's sessions were its own login user's (the gateway's event streams read on a pool of their own).
    assert sessions == {f"vidjobs-{service}": urlsplit(logins[service]).username for service in SERVICES} | {
        "vidjobs-gateway-streams": urlsplit(logins["gateway"]).username}
    refusals = {p.name: p.read_text().count("permission denied") for p in log_dir.glob("*.log")}
    assert set(refusals.values()) == {0}, refusals


async def _sessions(database_url: str) -> dict[str, str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT DISTINCT application_name, usename FROM pg_stat_activity "
                                "WHERE datname = current_database() AND application_name LIKE 'vidjobs-%'")
    finally:
        await conn.close()
    return {r["application_name"]: r["usename"] for r in rows}


async def _delivered(app) -> bool:
    return any(b'"job.completed"' in body for _, body in app.received["app"])


async def test_vidjobs_roles_puts_back_a_grant_changed_by_hand_and_prints_the_sql(database_url):
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute("REVOKE INSERT ON assets FROM vidjobs_media")
        await admin.execute("GRANT DELETE ON accounts TO vidjobs_media")
        drifted = await grants.in_step(admin)

        shown = await _vidjobs(database_url, "roles")
        printed = await _vidjobs(database_url, "roles", "--sql")
        restored = await grants.held(admin)
    finally:
        await admin.close()

    assert not drifted and restored == GRANTS
    assert shown[0] == 0, shown
    assert re.search(r"^vidjobs_media +assets +SELECT, INSERT, UPDATE$", shown[1], re.M), shown[1]
    assert printed[0] == 0 and 'GRANT SELECT, INSERT, UPDATE ON "assets" TO "vidjobs_media";' in printed[1]
    assert "CREATE ROLE vidjobs_reaper NOLOGIN;" in printed[1]


async def _vidjobs(database_url: str, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")} | {"VIDJOBS_DATABASE_URL": database_url}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "vidjobs.cli", *args, env=env, cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_a_migrator_older_than_the_schema_leaves_the_grants_alone(database_url):
    """During a rollout or a rollback an older process may migrate (every service does at start when it
    connects as the schema's owner): it applies what it knows, and must not take back a privilege the newer
    release granted, which its own declaration does not name. On a schema it knows, it does put drift back."""
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute("GRANT DELETE ON accounts TO vidjobs_media")  # as a newer release might
        await admin.execute("INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_newer.sql')")
        await db.migrate(database_url)
        kept = await grants.held(admin)
        await admin.execute("DELETE FROM schema_migrations WHERE version = 9999")
        await db.migrate(database_url)
        restored = await grants.held(admin)
    finally:
        await admin.close()

    assert Privilege.DELETE in kept["media"].get("accounts", frozenset()), "an older migrator took a newer grant back"
    assert restored == GRANTS


async def test_a_platforms_whole_flow_runs_on_the_gateways_own_role(tmp_path, database_url, nats_url, logins, caplog):
    """Every statement a platform's calls make (accounts made with their limits, plans, credit through
    platform_credit, keys, tokens, acting for an account, disabling, closing and the purge) is within the
    gateway role's grants: each answer is the expected one, and PostgreSQL refused nothing."""
    from tests.gateway_harness import JOB_BODY, gateway_settings, running_gateway
    from tests.test_platform import ALL_SCOPES, call, grant, signup
    from vidjobs.cli import platforms

    admin = await asyncpg.connect(database_url)
    try:
        key = (await platforms.create(admin, f"roles-{secrets.token_hex(3)}", ALL_SCOPES))[1]
    finally:
        await admin.close()
    settings = gateway_settings(tmp_path, logins["gateway"], nats_url)
    async with running_gateway(settings) as h:
        put = await call(h, key, "PUT", "/v1/platform/plans/pro", {"concurrent_jobs": 3, "fallback_models": []})
        account = await signup(h, key, "role-user", plan="pro", max_queued_jobs=10)
        acting = {"Vidjobs-Account": account["id"]}
        answers = {
            "plan": put[0],
            "grant": (await grant(h, key, account["id"], 1000, "g1"))[0],
            "take back": (await grant(h, key, account["id"], 100, "g2", action="take_back"))[0],
            "patch": (await call(h, key, "PATCH", f"/v1/platform/accounts/{account['id']}",
                                 {"concurrent_jobs": 2, "name": "Ada"}))[0],
            "key": (await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/keys", {}))[0],
            "token": (await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/tokens",
                                 {"scopes": ["read", "create"], "credit_ceiling": 500}))[0],
            "job": (await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting))[0],
            "disable": (await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/disable", {}))[0],
            "enable": (await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/enable"))[0],
            "audit": (await call(h, key, "GET", "/v1/platform/audit"))[0],
            "delete": (await call(h, key, "DELETE", f"/v1/platform/accounts/{account['id']}"))[0],
        }

        async def purged() -> bool:
            return await h.count("SELECT count(*) FROM accounts WHERE id = $1", account["id"]) == 0
        await wait_until(purged, within=30, what="the account purged on the gateway's role")

    assert answers == {"plan": 200, "grant": 201, "take back": 201, "patch": 200, "key": 201, "token": 201,
                       "job": 201, "disable": 200, "enable": 200, "audit": 200, "delete": 202}
    assert "permission denied" not in caplog.text
