"""Keeping every stored webhook secret sealed under the gateway's first key. The gateway checks at start that it
holds every key something is sealed under, then sweeps, at start and every few minutes after:

- plaintext the previous release left (or one of its gateways wrote during the rollout) is sealed, and the
  plaintext column emptied ('' rather than NULL: migration 0015 says why);
- a value sealed under another key of the ring (one being replaced) is sealed again under the first, so the
  old key can leave VIDJOBS_SECRETS_KEY once a sweep has run;
- a previous secret whose overlap has ended is forgotten.

A row is written only if it still holds what the sweep read, so gateways sweeping at once, or a rotation
meanwhile, lose nothing: the later write finds the row changed and leaves it to the next sweep.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from vidjobs.common.errors import ConfigError
from vidjobs.gateway.appwebhooks.secrets import ACCOUNT, ENDPOINT, Kind, opened, place
from vidjobs.gateway.sealing import SETTING, CannotUnseal, Keyring

log = logging.getLogger("vidjobs.gateway.appwebhooks")

EVERY_S = 300.0


class MissingKey(ConfigError):
    """Secrets in the database are sealed under a key VIDJOBS_SECRETS_KEY does not hold."""


@dataclass(frozen=True)
class Sweep:
    """One kind's statements: the rows to change ($1 the first key's id), the conditional write ($1 the row,
    $2-$4 what was read, $5-$6 what to write), and forgetting ended overlaps."""

    kind: Kind
    due: str
    write: str
    forget: str


_ENDPOINTS = Sweep(
    ENDPOINT,
    due="SELECT id, secret_sealed AS sealed, secret AS plain, previous_secret_sealed AS previous "
        "FROM webhook_endpoints WHERE secret <> '' OR split_part(secret_sealed, '.', 1) <> $1 "
        "OR split_part(previous_secret_sealed, '.', 1) <> $1",
    write="""
        UPDATE webhook_endpoints SET secret_sealed = $5, secret = '', previous_secret_sealed = $6
        WHERE id = $1 AND secret_sealed IS NOT DISTINCT FROM $2 AND secret IS NOT DISTINCT FROM $3
          AND previous_secret_sealed IS NOT DISTINCT FROM $4
        """,
    forget="UPDATE webhook_endpoints SET previous_secret_sealed = NULL, previous_secret_expires_at = NULL "
           "WHERE previous_secret_expires_at <= clock_timestamp()",
)

_ACCOUNTS = Sweep(
    ACCOUNT,
    due="SELECT id, webhook_secret_sealed AS sealed, webhook_secret AS plain, webhook_previous_secret_sealed "
        "AS previous FROM accounts WHERE webhook_secret <> '' OR split_part(webhook_secret_sealed, '.', 1) <> $1 "
        "OR split_part(webhook_previous_secret_sealed, '.', 1) <> $1",
    write="""
        UPDATE accounts SET webhook_secret_sealed = $5, webhook_secret = '', webhook_previous_secret_sealed = $6,
            webhook_secret_created_at = COALESCE(webhook_secret_created_at, clock_timestamp())
        WHERE id = $1 AND webhook_secret_sealed IS NOT DISTINCT FROM $2 AND webhook_secret IS NOT DISTINCT FROM $3
          AND webhook_previous_secret_sealed IS NOT DISTINCT FROM $4
        """,
    forget="UPDATE accounts SET webhook_previous_secret_sealed = NULL, webhook_previous_secret_expires_at = NULL "
           "WHERE webhook_previous_secret_expires_at <= clock_timestamp()",
)

_KEY_IDS = """
SELECT DISTINCT split_part(sealed, '.', 1) AS key_id FROM (
    SELECT secret_sealed AS sealed FROM webhook_endpoints
    UNION ALL SELECT previous_secret_sealed FROM webhook_endpoints
    UNION ALL SELECT webhook_secret_sealed FROM accounts
    UNION ALL SELECT webhook_previous_secret_sealed FROM accounts
) s WHERE sealed IS NOT NULL
"""


async def check_keys(pool: asyncpg.Pool, ring: Keyring) -> None:
    """Raises MissingKey when anything stored is sealed under a key the ring lacks: deliveries signed with
    it could not be sent, so the gateway refuses to start instead of failing them one by one."""
    used = {r["key_id"] for r in await pool.fetch(_KEY_IDS)}
    missing = sorted(used - set(ring.ids))
    if missing:
        raise MissingKey(f"webhook secrets in the database are sealed under key id(s) {', '.join(missing)}, which "
                         f"{SETTING} does not hold (it holds {', '.join(ring.ids)}): add the key that sealed them "
                         "to the list, after the first")


def _resealed(ring: Keyring, kind: Kind, row: asyncpg.Record) -> tuple[str | None, str | None]:
    """The row's (current, previous) secrets sealed under the first key; either None when there is none."""
    row_id, current, previous = row["id"], row["sealed"], row["previous"]
    if current is None or ring.key_id_of(current) != ring.primary_id:
        secret = opened(ring, kind, row_id, current, row["plain"])
        current = None if secret is None else ring.seal(secret, place(kind.current, row_id))
    if previous is not None and ring.key_id_of(previous) != ring.primary_id:
        at = place(kind.previous, row_id)
        previous = ring.seal(ring.unseal(previous, at), at)
    return current, previous


async def _sweep_kind(pool: asyncpg.Pool, ring: Keyring, sweep: Sweep) -> int:
    changed = 0
    for row in await pool.fetch(sweep.due, ring.primary_id):
        try:
            current, previous = _resealed(ring, sweep.kind, row)
        except CannotUnseal as exc:
            log.error("a stored webhook secret does not open; left as it is",
                      extra={"row": place(sweep.kind.current, row["id"]), "error": str(exc)})
            continue
        status = await pool.execute(sweep.write, row["id"], row["sealed"], row["plain"], row["previous"],
                                    current, previous)
        changed += status.endswith(" 1")
    await pool.execute(sweep.forget)
    return changed


async def sweep(pool: asyncpg.Pool, ring: Keyring) -> int:
    """One pass over endpoints and accounts; returns how many rows it sealed or resealed."""
    changed = sum([await _sweep_kind(pool, ring, kind) for kind in (_ENDPOINTS, _ACCOUNTS)])
    if changed:
        log.info("webhook secrets sealed under the current key", extra={"rows": changed})
    return changed
