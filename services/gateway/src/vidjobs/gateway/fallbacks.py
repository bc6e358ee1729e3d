"""Which models a job may move to while it waits (its `fallback_models`), checked when it is created.

A job names its own list, or takes its account's default (PATCH /v1/account). A list the job names is held
to it: every model must exist, take this very request (duration, ratio, resolution, params) and cost no more
than the job's quote, because a move never charges more than was reserved; anything else is a 422 naming the
model, since a fallback that could never be used is a mistake worth hearing about. The account's default is
a preference for every job, so a model that cannot take this one is left out of it quietly.

The move itself is the submitter's (vidjobs.submitter.failover).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from vidjobs.common import ratecard
from vidjobs.common.errors import ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.gateway.apierrors import invalid
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.registry import adapter_for

# An alias to the real model the job's account is routed to (a real model stays itself): LiveRoutes.route.
Resolve = Callable[[str], str]


class Unusable(ValueError):
    """A fallback model cannot take the job: the words say why."""


def _takes(adapters: dict[str, ProviderAdapter], request: JobRequest) -> None:
    try:
        adapter_for(adapters, request.provider).validate(request)
    except ProviderError as err:
        raise Unusable(err.message) from err


def candidates(adapters: dict[str, ProviderAdapter], resolve: Resolve, request: JobRequest,
               named: list[str]) -> list[str]:
    """The real models of `named` (aliases resolved), each checked to take `request`; raises Unusable."""
    out: list[str] = []
    for model in named:
        real = resolve(model)
        if real == request.model or real in out:
            continue  # moving to the model it already has, or twice to one model, changes nothing
        try:
            _takes(adapters, msgspec.structs.replace(request, model=real))
        except Unusable as err:
            raise Unusable(f"{model!r} cannot render this request: {err}") from err
        out.append(real)
    return out


def checked(adapters: dict[str, ProviderAdapter], resolve: Resolve, request: JobRequest, named: list[str] | None,
            default: list[str]) -> list[str]:
    """The job's fallbacks: its own list (a 422 for a model that cannot take it), or the account's default,
    less the models that cannot."""
    if named is not None:
        try:
            return candidates(adapters, resolve, request, named)
        except Unusable as err:
            raise invalid(f"fallback_models: {err}") from err
    kept = []
    for model in default:
        try:
            kept += candidates(adapters, resolve, request, [model])
        except Unusable:
            continue
    return [m for i, m in enumerate(kept) if m not in kept[:i]]


def within_quote(card: ratecard.RateCard, request: JobRequest, fallbacks: list[str], quote: int, *,
                 named: bool) -> list[str]:
    """The fallbacks priced at no more than `quote` on the job's card. One the job named itself that costs
    more is a 422 (the move would never happen); a default that does is left out."""
    kept = []
    for model in fallbacks:
        try:
            price = ratecard.estimate(card, msgspec.structs.replace(request, model=model))
        except ratecard.Unpriced as err:
            if named:
                raise invalid(f"fallback_models: {err}") from err
            continue
        if price > quote:
            if named:
                raise invalid(f"fallback_models: {model} would cost {price} credits for this request, more than "
                              f"its quote of {quote}; a job never moves to a dearer model, so name a cheaper one "
                              "or none")
            continue
        kept.append(model)
    return kept


def account_default(adapters: dict[str, ProviderAdapter], resolve: Resolve, models: list[str]) -> list[str]:
    """An account's default list as given to PATCH /v1/account: each model must exist (aliases resolved);
    whether one takes a given job is decided per job."""
    out: list[str] = []
    for model in models:
        real = resolve(model)
        try:
            adapter = adapter_for(adapters, real.split("/", 1)[0])
        except ProviderError as err:
            raise invalid(f"fallback_models: {model!r} names no provider we offer") from err
        if real not in {info.id for info in adapter.models()}:
            raise invalid(f"fallback_models: {model!r} is not a model of {adapter.name}; GET /v1/models lists them")
        if real not in out:
            out.append(real)
    return out

