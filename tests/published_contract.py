"""What a release promises the code around it: its OpenAPI document, its error codes (the statuses each is
answered with, and whether it is retryable), its events and its settings, as one JSON object.

A release's record is committed when it is cut (docs/contracts/<version>.json, docs/RELEASES.md) and
tests/test_contract.py holds this checkout to it. The record is made by that release's own code: this file is
run with the release's interpreter (`python -P tests/published_contract.py`, from the release's tree), so it
imports nothing of tests/, only the vidjobs packages it describes, and reads them through names every release
from 0.1.0 has."""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from typing import Any

import msgspec


def type_name(tp: Any) -> str:
    """A type as it is compared across releases: `int | None`, `dict[str, list[str]]`, `Literal['a', 'b']`.
    Constraints (`Annotated[int, Meta(ge=2)]`) are left out: a bound moving is not a change of type."""
    if tp is None or tp is type(None):
        return "None"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is typing.Union or isinstance(tp, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{type_name(origin)}[{', '.join(type_name(a) for a in args)}]"
    return str(getattr(tp, "__name__", repr(tp)))


def _openapi() -> dict[str, Any]:
    from vidjobs.common.settings import Settings
    from vidjobs.gateway.app import route_table
    from vidjobs.gateway.openapi import document

    # As docs/API.md is written (vidjobs.gateway.apidoc): the API of a deployment as `vidjobs up` runs it.
    return document(route_table(Settings(fake_provider="on")))


def _error_codes() -> dict[str, dict[str, Any]]:
    from vidjobs.common.errors import RETRYABLE, ErrorCode
    from vidjobs.gateway.apierrors import GatewayCode
    from vidjobs.gateway.errortable import ANSWERS

    codes: dict[str, dict[str, Any]] = {}
    for code in [*ErrorCode, *GatewayCode]:
        answer = ANSWERS.get(code)
        codes[code.value] = {
            "statuses": list(answer.statuses) if answer else [],  # [] : only ever a job's failure
            "in_job": isinstance(code, ErrorCode),
            "retryable": RETRYABLE[code] if isinstance(code, ErrorCode) else None,
        }
    return codes


def _events() -> dict[str, dict[str, Any]]:
    from vidjobs.common import events

    found: dict[str, dict[str, Any]] = {}
    for cls in vars(events).values():
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)) or cls.__struct_config__.tag is None:
            continue
        found[str(cls.__struct_config__.tag)] = {
            "class": cls.__name__,
            "fields": {f.encode_name: {"type": type_name(f.type), "required": f.required}
                       for f in msgspec.structs.fields(cls)},
        }
    return dict(sorted(found.items()))


def _settings() -> dict[str, dict[str, Any]]:
    from vidjobs.common.settings import PREFIX, Settings

    return {f"{PREFIX}{f.name.upper()}": {"type": type_name(f.type)} for f in msgspec.structs.fields(Settings)}


def published() -> dict[str, Any]:
    return {"openapi": _openapi(), "error_codes": _error_codes(), "events": _events(), "settings": _settings()}


def _jsonable(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else str(value)


if __name__ == "__main__":
    json.dump(published(), sys.stdout, indent=1, sort_keys=True, default=_jsonable)
    sys.stdout.write("\n")
