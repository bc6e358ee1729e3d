"""`vidjobs accounts delete ID [--purge]` against the whole stack: an account with a finished job (its render,
thumbnail and preview in storage), a job still rendering, an uploaded image, a webhook endpoint and its
deliveries. Closing it revokes its keys and cancels the live job through the cancel path; purging it leaves
no row in any table with an account or job column, and no object, and touches no other account.

One test, one stack (about a minute on 2 cores): the stack's start and each `vidjobs` process (a few seconds
apiece) are most of it, and every step builds on the state the one before left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests import imagefiles
from tests.stack import Stack, demo_key, running_stack, stack_settings
from tests.support import operator_command, wait_until
from vidjobs.cli.embedded import free_port
from vidjobs.cli.exitcodes import Exit
from vidjobs.gateway.accounts import hash_key
from vidjobs.gateway.ratelimit import KEY_CACHE_S


async def _post(stack: Stack, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with stack.session.post(f"{stack.url}{path}", json=body, headers={**stack.auth, **(headers or {})}) as resp:
        return resp.status, await resp.json()


async def _upload(stack: Stack) -> str:
    headers = {**stack.auth, "Content-Type": "image/png"}
    async with stack.session.post(f"{stack.url}/v1/uploads", data=imagefiles.png_with_text(), headers=headers) as resp:
        assert resp.status == 201, await resp.text()
        return (await resp.json())["id"]


async def _fill(stack: Stack, hook: str) -> tuple[str, str]:
    """A finished job with its objects and deliveries, an uploaded image, and a job still rendering."""
    status, endpoint = await _post(stack, "/v1/webhook-endpoints", {"url": hook})
    assert status == 201, endpoint
    await _upload(stack)
    done = await stack.create_job(params={"render_s": 0.2})
    assert (await stack.wait_terminal(done["id"]))["status"] == "completed"
    status, live = await _post(stack, "/v1/jobs", {"model": "fake/default", "prompt": "a slow fox", "duration_s": 1,
                                                  "params": {"scenario": "hang"}}, {"Idempotency-Key": "slow-1"})
    assert status == 201, live
    await stack.wait_for_status(live["id"], "processing")
    return done["id"], live["id"]


async def _account_tables(conn: asyncpg.Connection) -> dict[str, set[str]]:
    rows = await conn.fetch(
        """
        SELECT c.table_name, c.column_name FROM information_schema.columns c
        JOIN information_schema.tables t USING (table_schema, table_name)
        WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
          AND c.column_name IN ('account_id', 'job_id')
        """)
    tables: dict[str, set[str]] = {}
    for r in rows:
        tables.setdefault(r["table_name"], set()).add(r["column_name"])
    return tables


async def _rows_of(conn: asyncpg.Connection, account_id: str, job_ids: list[str]) -> dict[str, int]:
    """Rows of the account or its jobs, in every table with an account or job column (and accounts, jobs)."""
    counts = {"accounts": await conn.fetchval("SELECT count(*) FROM accounts WHERE id = $1", account_id)}
    for table, columns in (await _account_tables(conn)).items():
        about = " OR ".join((["account_id = $1"] if "account_id" in columns else []) +
                            (["job_id = ANY($2::text[])"] if "job_id" in columns else []))
        # Both arguments are always named, so either kind of table takes the same two.
        counts[table] = await conn.fetchval(
            f'SELECT count(*) FROM "{table}" WHERE ({about}) AND $1::text IS NOT NULL AND $2::text[] IS NOT NULL',
            account_id, job_ids)
    return {table: n for table, n in counts.items() if n}


def _objects(root: Path, account_id: str) -> list[Path]:
    base = root / "accounts" / account_id
    return [p for p in base.rglob("*") if p.is_file()] if base.exists() else []


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    port = free_port()  # nothing listens: the deliveries fail and wait for a retry, rows that must go too
    return stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=f"127.0.0.1:{port}",
                          recovery_delay_s=600), f"http://127.0.0.1:{port}/hook"


async def test_closing_then_purging_an_account_leaves_nothing_of_it(settings, database_url):
    settings, hook = settings
    root = Path(settings.storage_url.removeprefix("file://"))
    vidjobs = operator_command(database_url, storage_url=settings.storage_url)
    other_key = await demo_key(database_url)
    async with running_stack(settings) as stack:
        done, live = await _fill(stack, hook)
        other = await stack.as_key(other_key).create_job(params={"render_s": 0.2})
        await stack.as_key(other_key).wait_terminal(other["id"])
        conn = await asyncpg.connect(database_url)
        try:
            account_id = await conn.fetchval("SELECT account_id FROM api_keys WHERE key_hash = $1",
                                             hash_key(stack.key))
            other_id = await conn.fetchval("SELECT account_id FROM api_keys WHERE key_hash = $1", hash_key(other_key))
            job_ids = [done, live]
            before = await _rows_of(conn, account_id, job_ids)
            assert {"accounts", "jobs", "api_keys", "assets", "uploads", "credit_ledger", "job_transitions",
                    "webhook_endpoints", "webhook_deliveries", "idempotency_keys"} <= set(before), before
            assert len(_objects(root, account_id)) >= 4  # render, thumbnail, preview, upload
            others_before = await _rows_of(conn, other_id, [other["id"]])

            # Closing: keys revoked (each gateway refuses them once it rereads the key, within KEY_CACHE_S), the
            # live job canceled as an owner's cancel is.
            closed = await vidjobs("accounts", "delete", account_id, "--json")
            assert closed.code == 0, closed.err
            assert json.loads(closed.out) == {"account_id": account_id, "keys_revoked": 1, "jobs_canceled": [live]}
            await wait_until(lambda: _refused(stack, live), within=KEY_CACHE_S + 5, what="the revoked key refused")
            job = await conn.fetchrow("SELECT status, error FROM jobs WHERE id = $1", live)
            assert job["status"] == "canceled" and json.loads(job["error"])["code"] == "canceled"
            assert await conn.fetchval("SELECT reason FROM job_transitions WHERE job_id = $1 ORDER BY id DESC LIMIT 1",
                                       live) == "account closed by an operator"
            settled = await conn.fetchval("SELECT count(*) FROM credit_ledger WHERE job_id = $1 AND kind IN "
                                          "('release', 'charge')", live)
            assert settled == 1  # the cancel settled its reservation
            assert (await _rows_of(conn, account_id, job_ids)).get("jobs") == 2  # nothing removed yet

            # A copy still in progress holds the purge off; nothing is removed meanwhile.
            await conn.execute("INSERT INTO media_copies (job_id, owner, expires_at) VALUES ($1, 'test', "
                               "now() + interval '1 hour')", done)
            refused = await vidjobs("accounts", "delete", account_id, "--purge", "--wait", "0.5")
            assert refused.code == Exit.REFUSED and "being copied" in refused.err, refused.err
            assert len(_objects(root, account_id)) >= 4 and (await _rows_of(conn, account_id, job_ids))["jobs"] == 2
            await conn.execute("DELETE FROM media_copies WHERE job_id = $1", done)

            purged = await vidjobs("accounts", "delete", account_id, "--purge", "--json")
            assert purged.code == 0, purged.err
            report = json.loads(purged.out)
            assert report["objects"] >= 4 and report["rows"]["accounts"] == 1 and report["rows"]["jobs"] == 2
            assert report["rows"]["credit_ledger"] == before["credit_ledger"] + 1  # and the cancel's release
            assert await _rows_of(conn, account_id, job_ids) == {}
            assert _objects(root, account_id) == []
            assert await _rows_of(conn, other_id, [other["id"]]) == others_before
            assert len(_objects(root, other_id)) >= 3

            again = await vidjobs("accounts", "delete", account_id, "--purge")
            assert again.code == Exit.NOT_FOUND, again.err  # nothing was left to finish
        finally:
            await conn.close()

        async def provider_stopped() -> bool:
            async with stack.session.get(f"{stack.settings.fake_provider_url}/v1/renders",
                                         params={"job_id": live}) as resp:
                renders = (await resp.json())["data"]
            return bool(renders) and renders[-1]["status"] == "canceled"

        # The rows are gone; the stop request staged with the cancel still went out.
        await wait_until(provider_stopped, within=30, what="the provider to stop the live job's render")


async def _refused(stack: Stack, job_id: str) -> bool:
    async with stack.session.get(f"{stack.url}/v1/jobs/{job_id}", headers=stack.auth) as resp:
        return resp.status == 401
