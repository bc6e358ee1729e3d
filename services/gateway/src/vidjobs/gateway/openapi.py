"""`GET /openapi.json`, generated from the route table and the msgspec Structs the handlers use."""

from __future__ import annotations

import http
import inspect
import re
import typing
from typing import Any

import msgspec
from aiohttp import web

from vidjobs.gateway.routetable import ResponseSpec, Route

_REF = "#/components/schemas/{name}"
_PATH_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")


def _structs(routes: list[Route]) -> list[type]:
    found: list[type] = []
    for route in routes:
        candidates = [route.body, route.query, *route.responses.values()]
        found += [c for c in candidates if isinstance(c, type) and c not in found]
    return found


# An event stream's items: `event: job` with the job as its data, on connect and on every change (the
# `itemSchema` of sequential media, as OpenAPI 3.2 spells it).
_EVENT_STREAM = {"schema": {"type": "string", "description": "Server-Sent Events: `event: job` and `data: "
                                                             "<the job as JSON>` on connect and on every change; "
                                                             "the stream closes once the job is terminal"},
                 "itemSchema": {"$ref": _REF.format(name="JobOut")}}


def _content(spec: ResponseSpec, schema_of: dict[type, Any]) -> dict[str, Any]:
    if isinstance(spec, type):
        return {"application/json": {"schema": schema_of[spec]}}
    if spec == "text/event-stream":
        return {spec: _EVENT_STREAM}
    return {spec: {"schema": {"type": "string"}}} if spec else {}


def _parameters(route: Route, components: dict[str, Any]) -> list[dict[str, Any]]:
    params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
              for n in _PATH_PARAM.findall(route.path)]
    if route.query is not None:
        schema = components[route.query.__name__]
        for name, prop in schema["properties"].items():
            params.append({"name": name, "in": "query", "required": name in schema.get("required", []),
                           "schema": prop})
    params += [{"name": h, "in": "header", "required": False, "description": d, "schema": {"type": "string"}}
               for h, d in route.headers.items()]
    return params


_STRING = {"schema": {"type": "string"}}
# On every answer (vidjobs.gateway.access).
_EVERY_ANSWER = {"X-Request-Id": {"description": "this request's id: the one sent, when well-formed, else a new "
                                                 "one; error bodies repeat it", **_STRING}}
# On every answer to a request made with an API key (vidjobs.gateway.auth), as the IETF draft spells them.
_KEYED_ANSWER = {
    "RateLimit-Policy": {"description": 'the key\'s bucket: `"per-key";q=<requests at once>;w=<seconds to refill>`',
                         **_STRING},
    "RateLimit": {"description": '`"per-key";r=<requests left>;t=<seconds until the bucket is full>`', **_STRING},
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", **_STRING}}


def _headers(route: Route, status: int) -> dict[str, Any]:
    headers = {**_EVERY_ANSWER, **(_KEYED_ANSWER if route.auth else {}), **route.response_headers.get(status, {})}
    if status in (429, 503):
        headers.update(_RETRY_AFTER)
    return headers


def _operation(route: Route, schema_of: dict[type, Any], components: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.summary,
        "parameters": _parameters(route, components),
        "security": [{"bearer": []}] if route.auth else [],
        "responses": {
            str(status): {"description": http.HTTPStatus(status).phrase, "content": _content(spec, schema_of),
                          "headers": _headers(route, status)}
            for status, spec in sorted(route.responses.items())
        },
    }
    if route.body is not None:
        op["requestBody"] = {"required": route.body_required, "content": _content(route.body, schema_of)}
    if route.auth:
        op["x-vidjobs-access"] = _access(route)
    return op


def _access(route: Route) -> dict[str, Any]:
    """Which credentials may call the route (gateway/credentials.py): a platform key with `platform_scope`
    (a platform route), or the account's key, a platform acting for the account, and a browser token with
    `token_scope` (an account route)."""
    if route.platform_scope is not None:
        return {"platform_scope": route.platform_scope or None}
    return {"account": route.account, "token_scope": route.token_scope}


_FIELD = re.compile(r"^\s+(\w+)\s*:([^#]*)(?:#\s*(.+))?$")
_COMMENT = re.compile(r"^\s+#\s*(.+)$")


def _field_notes(cls: type) -> dict[str, str]:
    """What the code says each field means: its trailing comment, or the comment line just above it, in the
    class or a base. The document's descriptions are the lines a reader of the code sees."""
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        above = None
        for line in source.splitlines():
            if (comment := _COMMENT.match(line)) is not None:
                above = comment[1].strip()
                continue
            if (field := _FIELD.match(line)) is not None and (note := field[3] or above):
                notes[field[1]] = note.strip()
            above = None
    return notes


def _describe(components: dict[str, Any], structs: list[type]) -> None:
    seen: dict[str, type] = {}
    stack = list(structs)
    while stack:
        cls = stack.pop()
        if cls.__name__ in seen:
            continue
        seen[cls.__name__] = cls
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except (NameError, TypeError):
            hints = {}
        for hint in hints.values():
            stack += [t for t in _struct_types(hint) if t.__name__ not in seen]
    for name, cls in seen.items():
        props = components.get(name, {}).get("properties", {})
        for field, note in _field_notes(cls).items():
            target = props.get(msgspec.structs.fields(cls) and _encoded_name(cls, field), {})
            if target is not None and "description" not in target and field in _field_names(cls):
                target["description"] = note


def _field_names(cls: type) -> set[str]:
    return {f.name for f in msgspec.structs.fields(cls)}


def _encoded_name(cls: type, field: str) -> str:
    return next((f.encode_name for f in msgspec.structs.fields(cls) if f.name == field), field)


def _struct_types(hint: Any) -> list[type]:
    """The Struct classes a field's type names, however nested (a list of them, one or None)."""
    if isinstance(hint, str):
        return []
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return [hint]
    return [t for arg in typing.get_args(hint) for t in _struct_types(arg)]


def document(routes: list[Route]) -> dict[str, Any]:
    structs = _structs(routes)
    schemas, components = msgspec.json.schema_components(structs, ref_template=_REF)
    _describe(components, structs)
    schema_of = dict(zip(structs, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if route.documented:
            path = _PATH_PARAM.sub(r"{\1}", route.path)
            paths.setdefault(path, {})[route.method.lower()] = _operation(route, schema_of, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "vidjobs", "version": "1", "description": "AI video render jobs, end to end."},
        # Relative: the document is served by the gateway it describes, wherever that is reached.
        "servers": [{"url": "/", "description": "the gateway serving this document"}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "an API key (vj_), a platform key (vjp_) or a browser "
                                                          "token (vjt_); see x-vidjobs-access"}},
        },
    }


def openapi_route(routes: list[Route]) -> Route:
    """The document's own route; it lists itself too."""
    body = b""

    async def serve(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    route = Route("GET", "/openapi.json", serve, "openapi", "This document", auth=False,
                  responses={200: "application/json"})
    body = msgspec.json.encode(document([*routes, route]))
    return route
