"""The secrets that sign deliveries: one per endpoint (shown once, when it is registered) and one per account
for the `webhook_url` a job names for itself."""

from __future__ import annotations

import asyncpg

from vidjobs.providers import webhooks


def new_secret() -> str:
    return webhooks.new_secret()


async def account_secret(pool: asyncpg.Pool, account_id: str) -> str:
    """The secret that signs deliveries to jobs' own webhook_url, made on first use."""
    return await pool.fetchval(
        "UPDATE accounts SET webhook_secret = COALESCE(webhook_secret, $2) WHERE id = $1 RETURNING webhook_secret",
        account_id, webhooks.new_secret())


async def signing_secrets(pool: asyncpg.Pool, account_id: str, endpoint_id: str | None) -> list[str]:
    """The secrets a delivery is signed with, the current one first: its endpoint's, or the account's for a
    job's own webhook_url (made now if the account never asked for it)."""
    if endpoint_id is not None:
        secret = await pool.fetchval("SELECT secret FROM webhook_endpoints WHERE id = $1", endpoint_id)
        return [secret] if secret is not None else []
    return [await account_secret(pool, account_id)]
