"""Rollout routing: a model alias sends a share of its accounts to each of several real models, so a new
provider can take a small part of the traffic before it takes all of it.

The pick is sticky: an account's jobs through an alias all go to one route until the alias's routes change.
It is a deterministic draw, hash(account, alias, version) read as a point in [0, 1), laid over the enabled
routes' cumulative shares in model order. Accounts spread uniformly over [0, 1), so across many accounts
each route takes its share of them; a change of the alias (a new version) deals every account again.
"""

from __future__ import annotations

import hashlib

from vidjobs.common.modelroutes import AliasRoutes, Table


def draw(account_id: str, alias: str, version: int) -> float:
    """The account's point in [0, 1) for this version of the alias: the same on every replica."""
    digest = hashlib.sha256(f"{account_id}\x00{alias}\x00{version}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick(routes: AliasRoutes, point: float) -> str:
    """The route whose stretch of the cumulative shares holds `point` (in [0, 1))."""
    shares = routes.shares
    left = point * sum(s.share for s in shares)
    for share in shares:
        left -= share.share
        if left < 0:
            return share.model
    return shares[-1].model


def route(model: str, table: Table, account_id: str) -> tuple[str, str | None]:
    """(the real model to render with, the alias it was chosen through or None)."""
    routes = table.get(model)
    if routes is None:
        return model, None
    return pick(routes, draw(account_id, model, routes.version)), model


def aliases_of(table: Table) -> dict[str, list[str]]:
    """Each real model and the aliases that send some of their accounts to it."""
    out: dict[str, list[str]] = {}
    for alias, routes in sorted(table.items()):
        for share in routes.shares:
            out.setdefault(share.model, []).append(alias)
    return out
