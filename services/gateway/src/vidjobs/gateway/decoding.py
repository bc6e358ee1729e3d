"""Turning request bodies and query strings into Structs, and decode failures into errors that name the field.

A body that is not JSON is a 400; JSON that breaks the schema is a 422. Either way nothing past this point
runs, so a bad request never reaches a queue or creates a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import msgspec
import msgspec.inspect
from aiohttp import web

from vidjobs.gateway.apierrors import ApiError, GatewayCode, invalid

T = TypeVar("T")

# msgspec reports a failed pattern as the regex itself; a person deserves the rule in words.
_PATTERN_HINTS = {
    "model": "must be `<provider>/<model name>`, e.g. `fake/default`",
    "prompt": "must not be blank",
    "input_image": "must be an upload id (`upl_...`) from POST /v1/uploads",
    "group_by": "must be model, day or metadata.<key>, the key 1-40 letters, digits, `_`, `.` or `-`",
}


def choices(kind: type, name: str) -> tuple[str, ...] | None:
    """The values a field of `kind` that takes one of a fixed few may hold (a Literal, or one or none)."""
    info = msgspec.inspect.type_info(kind)
    for field in info.fields if isinstance(info, msgspec.inspect.StructType) else ():
        if field.encode_name != name:
            continue
        options = field.type.types if isinstance(field.type, msgspec.inspect.UnionType) else (field.type,)
        for option in options:
            if isinstance(option, msgspec.inspect.LiteralType):
                return tuple(str(value) for value in option.values)
    return None


def field_message(exc: msgspec.ValidationError, kind: type | None = None) -> str:
    """`Expected int <= 60 - at $.duration_s` becomes `duration_s: Expected int <= 60`; a field of `kind` that
    takes one of a fixed few values is answered with them."""
    text = str(exc)
    head, sep, tail = text.rpartition(" - at `$")
    if not sep:
        return text  # a missing or unknown field: msgspec already names it
    path = tail.rstrip("`").lstrip(".")
    if "matching regex" in head and path in _PATTERN_HINTS:
        head = _PATTERN_HINTS[path]
    elif kind is not None and (allowed := choices(kind, path)):
        head = f"{head}; use one of {', '.join(allowed)}"
    return f"{path}: {head}"


def is_json(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


CHUNK_BYTES = 64 * 1024


def too_large(max_bytes: int, what: str = "request body") -> ApiError:
    return ApiError(413, GatewayCode.PAYLOAD_TOO_LARGE, f"the {what} is larger than {max_bytes} bytes, the limit")


async def read_body(request: web.Request, max_bytes: int, what: str = "request body") -> bytes:
    """The whole body, or 413 once it proves longer than `max_bytes` (by its header or by what arrived). Each
    route names its own limit; no more than that is ever held."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large(max_bytes, what)
    body = bytearray()
    while chunk := await request.content.read(min(CHUNK_BYTES, max_bytes + 1 - len(body))):
        body += chunk
        if len(body) > max_bytes:
            raise too_large(max_bytes, what)
    return bytes(body)


async def read_json(request: web.Request, kind: type[T], max_bytes: int) -> T:
    if not is_json(request.content_type):
        raise ApiError(415, GatewayCode.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
    raw = await read_body(request, max_bytes)
    try:
        decoded = msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise invalid(field_message(exc, kind)) from exc
    except msgspec.DecodeError as exc:
        raise invalid(f"body is not valid JSON: {exc}", status=400) from exc
    if b"\\u0000" in raw and (where := nul_in(msgspec.to_builtins(decoded))) is not None:
        raise invalid(f"{where}: contains a NUL character (\\u0000), which no text here may hold")
    return decoded


async def read_optional_json(request: web.Request, kind: type[T], max_bytes: int) -> T:
    """A body the client may leave out: none at all is `kind` with its defaults; one given is read_json's."""
    if not request.body_exists:
        return kind()
    return await read_json(request, kind, max_bytes)


def nul_in(value: object, path: str = "") -> str | None:
    """The path of the first string holding a NUL character (PostgreSQL text cannot hold one), or None."""
    if isinstance(value, str):
        return (path or "body") if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return f"{path}.{key!r}".lstrip(".")
        if (found := nul_in(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")) is not None:
            return found.lstrip(".")
    return None


def read_query(query: Mapping[str, str], kind: type[T]) -> T:
    if len(query) != len(set(query)):
        raise invalid("each query parameter may be given once", status=400)
    if (where := nul_in(dict(query))) is not None:
        raise invalid(f"{where}: contains a NUL character (%00), which no parameter may hold", status=400)
    try:
        return msgspec.convert(dict(query), kind, strict=False)
    except msgspec.ValidationError as exc:
        raise invalid(field_message(exc, kind)) from exc
