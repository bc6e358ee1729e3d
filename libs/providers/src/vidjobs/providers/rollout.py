"""Rollout routing: a model alias sends a configured share of its jobs to each of several real models, so a
new provider can take a small percentage of traffic before it takes all of it."""

from __future__ import annotations

import random

from vidjobs.common.settings import RouteShare


def route(model: str, routes: dict[str, list[RouteShare]], *, draw: float | None = None) -> tuple[str, str | None]:
    """(the real model to render with, the alias it was chosen through or None). `draw` in [0, 1) picks the
    share; a fresh random one by default."""
    shares = [s for s in routes.get(model, ()) if s.share > 0]
    if not shares:
        return model, None
    point = (random.random() if draw is None else draw) * sum(s.share for s in shares)
    for share in shares:
        point -= share.share
        if point < 0:
            return share.model, model
    return shares[-1].model, model
