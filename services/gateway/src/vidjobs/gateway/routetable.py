"""One table of routes, read twice: to register the handlers and to write the OpenAPI document, so the
document cannot drift from what is served."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A response is a Struct (JSON), a media type for anything else, or None for an empty body.
ResponseSpec = type[msgspec.Struct] | str | None


@dataclass(frozen=True)
class Access:
    """Who besides the account's own API key may call a route (see Route)."""

    platform_scope: str | None
    token_scope: str | None
    account: bool = True  # False: not for the account's key (nor a platform acting for it): a token's own route


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    name: str
    summary: str
    responses: Mapping[int, ResponseSpec]
    auth: bool = True
    body: type[msgspec.Struct] | str | None = None
    body_required: bool = True  # False: the body may be left out (its defaults are taken)
    query: type[msgspec.Struct] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # request header -> description
    # status -> response header -> its OpenAPI header object, beside the ones every answer carries
    response_headers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    documented: bool = True
    # Who may call it besides the account's own API key (and a platform key acting for the account): a route
    # with `platform_scope` is a platform route, for a platform key with that scope only ("" : any platform
    # key); `token_scope` lets a browser token with that scope call an account route ("any": every token).
    platform_scope: str | None = None
    token_scope: str | None = None
    account: bool = True  # False: only a browser token calls it (its own grant)

    @property
    def access(self) -> Access:
        return Access(self.platform_scope, self.token_scope, self.account)


def json_response(body: msgspec.Struct, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body), content_type="application/json",
                        headers=headers)


def register(app: web.Application, routes: list[Route]) -> None:
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler, name=route.name)
