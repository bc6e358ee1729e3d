"""Nothing outlives its row. A failover to an asynchronous standby can lose a job's row after its render was
started (docs/RELIABILITY.md "PostgreSQL failover"): the provider goes on rendering, and calls back about a job
of ours that no row holds. That render is asked to stop, the callback is kept marked as such (`vidjobs inbox
unmatched`), and no app webhook, credit entry or job comes of it.

The render is started here as the submitter starts one (our job id and attempt in its metadata, the gateway's
callback URL), for a job id no row holds: what the provider holds once the row is gone."""

from __future__ import annotations

import json
import secrets

import asyncpg

from tests.stack import Stack, running_stack, stack_settings
from tests.support import operator_command, wait_until
from vidjobs.cli.exitcodes import Exit
from vidjobs.common import signatures

HOOK_HOST = "127.0.0.1:9"  # nothing listens there; a delivery would still be a row


async def _start_render(stack: Stack, job_id: str, scenario: str) -> str:
    """A render at the fake provider for `job_id`, calling back to the gateway; its provider job id."""
    body = {"model": "default", "prompt": "a red fox in snow", "duration_s": 1, "aspect_ratio": "16:9",
            "resolution": "720p", "seed": 1, "negative_prompt": None, "input_image_url": None,
            "params": {"scenario": scenario, "render_s": 0.2},
            "callback_url": f"{stack.url}/v1/webhooks/fake", "metadata": {"job_id": job_id, "attempt": 1}}
    async with stack.session.post(f"{stack.settings.fake_provider_url}/v1/renders", json=body,
                                  headers={"Idempotency-Key": f"{job_id}:1"}) as resp:
        assert resp.status == 201, await resp.text()
        return (await resp.json())["id"]


async def _render_status(stack: Stack, render_id: str) -> str:
    async with stack.session.get(f"{stack.settings.fake_provider_url}/v1/renders/{render_id}") as resp:
        return (await resp.json())["status"]


async def _is_finished(stack: Stack, render_id: str) -> bool:
    return await _render_status(stack, render_id) == "succeeded"


async def _call_back(stack: Stack, render_id: str) -> None:
    """The provider's callback about the render as it is now."""
    async with stack.session.get(f"{stack.settings.fake_provider_url}/v1/renders/{render_id}") as resp:
        render = await resp.json()
    body = json.dumps({"type": f"render.{render['status']}", "timestamp": render["finished_at"],
                       "data": render}).encode()
    headers = {"Content-Type": "application/json",
               **signatures.signed_headers(stack.settings.fake_webhook_secret, body)}
    async with stack.session.post(f"{stack.url}/v1/webhooks/fake", data=body, headers=headers) as resp:
        assert resp.status == 200 and (await resp.json())["stored"], await resp.text()


async def _kept(database_url: str, render_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetch("SELECT job_id, state, stop_asked_at FROM provider_answers "
                                "WHERE provider_job_id = $1 ORDER BY id", render_id)
    finally:
        await conn.close()


async def _traces(database_url: str, job_id: str) -> dict[str, int]:
    """Every row anywhere that would show the lost job being charged, announced or brought back."""
    queries = {
        "jobs": "SELECT count(*) FROM jobs WHERE id = $1",
        "credit_ledger": "SELECT count(*) FROM credit_ledger WHERE job_id = $1",
        "webhook_deliveries": "SELECT count(*) FROM webhook_deliveries WHERE job_id = $1",
        "job_transitions": "SELECT count(*) FROM job_transitions WHERE job_id = $1",
    }
    conn = await asyncpg.connect(database_url)
    try:
        return {table: await conn.fetchval(sql, job_id) for table, sql in queries.items()}
    finally:
        await conn.close()


async def _app_webhook(stack: Stack) -> None:
    """An app webhook endpoint for every event, so one sent for the lost job would be seen."""
    body = {"url": f"http://{HOOK_HOST}/hook"}  # every event
    async with stack.session.post(f"{stack.url}/v1/webhook-endpoints", json=body, headers=stack.auth) as resp:
        assert resp.status == 201, await resp.text()


async def test_a_render_still_going_for_a_job_no_row_holds_is_stopped_and_kept_marked(tmp_path, database_url,
                                                                                        nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=HOOK_HOST)
    lost = f"job_{secrets.token_hex(8)}"
    async with running_stack(settings) as stack:
        await _app_webhook(stack)
        render_id = await _start_render(stack, lost, "hang")  # running for ever unless stopped

        async def stopped() -> bool:
            return await _render_status(stack, render_id) == "canceled"
        await wait_until(stopped, within=30, what="the provider to be asked to stop the render")

        async def marked() -> bool:
            return any(r["stop_asked_at"] is not None for r in await _kept(database_url, render_id))
        await wait_until(marked, within=15, what="the callback kept, marked as a render asked to stop")
        kept = await _kept(database_url, render_id)
        traces = await _traces(database_url, lost)
        unmatched = await operator_command(database_url)("inbox", "unmatched", "--json")

    assert all(r["job_id"] is None for r in kept), kept
    assert traces == {"jobs": 0, "credit_ledger": 0, "webhook_deliveries": 0, "job_transitions": 0}
    # What an operator is shown: the render, with when it was asked to stop.
    shown = [json.loads(line) for line in unmatched.out.splitlines()]
    assert unmatched.code == Exit.OK and shown, unmatched.err
    assert {a["provider_job_id"] for a in shown} == {render_id} and any(a["stop_asked_at"] for a in shown), shown


async def test_a_finished_render_for_a_job_no_row_holds_is_kept_and_costs_no_one(tmp_path, database_url,
                                                                                   nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=HOOK_HOST)
    lost = f"job_{secrets.token_hex(8)}"
    async with running_stack(settings) as stack:
        await _app_webhook(stack)
        # Rendered without a word (a callback while it ran would have it stopped); its last word is sent here
        # once it has finished, signed as the provider signs it.
        render_id = await _start_render(stack, lost, "no_callback")
        await wait_until(lambda: _is_finished(stack, render_id), within=30, what="the render to finish")
        await _call_back(stack, render_id)

        async def kept_finished() -> bool:
            return any(r["state"] == "succeeded" for r in await _kept(database_url, render_id))
        await wait_until(kept_finished, within=30, what="the finished render's callback kept")
        kept = await _kept(database_url, render_id)
        traces = await _traces(database_url, lost)
        fetched = (await stack.counters())["output_fetches"].get(render_id, 0)

    # Nothing is left to stop: the callback is kept (job_id NULL, no stop asked) and nothing copies it.
    assert [(r["job_id"], r["stop_asked_at"]) for r in kept if r["state"] == "succeeded"] == [(None, None)]
    assert fetched == 0
    assert traces == {"jobs": 0, "credit_ledger": 0, "webhook_deliveries": 0, "job_transitions": 0}
