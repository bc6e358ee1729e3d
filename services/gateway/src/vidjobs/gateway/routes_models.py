"""`GET /v1/models`: the models this deployment renders with, what each takes (from its adapter's own
tables, the same ones a create is validated against), and its price per second on the current rate card."""

from __future__ import annotations

from aiohttp import web

from vidjobs.common import ratecard
from vidjobs.gateway.apierrors import ErrorOut
from vidjobs.gateway.bodies import ModelList, ModelOut
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant
from vidjobs.providers.base import ModelInfo


def _price(card: ratecard.RateCard, model: str, resolution: str) -> float | None:
    try:
        return ratecard.price_of(card, model, resolution).credits_per_second
    except ratecard.Unpriced:
        return None


def model_out(info: ModelInfo, card: ratecard.RateCard, aliases: list[str]) -> ModelOut:
    resolutions = dict.fromkeys(f.resolution for f in [*info.formats, *(info.formats_with_image or [])])
    return ModelOut(
        id=info.id, provider=info.id.split("/", 1)[0], aliases=aliases, durations_s=info.durations_s,
        rounds_up=info.rounds_up, formats=info.formats, formats_with_image=info.formats_with_image,
        input_image=info.input_image, negative_prompt=info.negative_prompt, seed=info.seed,
        credits_per_second={res: _price(card, info.id, res) for res in resolutions},
    )


async def list_models(request: web.Request) -> web.Response:
    gw = gateway(request)
    card = await tenant(request).rate_card()
    aliases = gw.routes.aliases()
    models = [model_out(info, card, aliases.get(info.id, []))
              for name in sorted(gw.adapters) for info in gw.adapters[name].models()]
    return json_response(ModelList(data=models, rate_card_version=card.version))


ROUTES = [
    Route("GET", "/v1/models", list_models, "list_models",
          "The models this deployment renders with, what each takes and its price per second",
          token_scope="any", responses={200: ModelList, 401: ErrorOut}),
]
