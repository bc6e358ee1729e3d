"""Where each recorded provider payload (tests/payloads/<provider>/*.json) gets its shape: every provider's
folder holds a PROVENANCE.toml naming its official SDK and pinned version, and for each payload the SDK model
that parses it and/or the provider's documentation page it was recorded from:

    [sdk]
    package = "runwayml"            # the distribution, pinned in the root pyproject's test group
    version = "5.24.0"

    [payloads."task_succeeded.json"]
    model = "runwayml.types:TaskRetrieveResponse"   # module:attribute, a pydantic model or type
    docs = "https://docs.dev.runwayml.com/api/#tag/Tasks"
    note = "why it differs from the SDK, where it does"
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pydantic
from pydantic import v1 as pydantic_v1

PAYLOADS = Path(__file__).resolve().parents[1] / "payloads"
# Files in a payload folder that are our own tables, not a provider's payloads.
OURS = frozenset({"expected_signals.json"})


class Sdk(msgspec.Struct, forbid_unknown_fields=True):
    package: str
    version: str


class Source(msgspec.Struct, forbid_unknown_fields=True):
    model: str = ""
    docs: str = ""
    note: str = ""


class Provenance(msgspec.Struct, forbid_unknown_fields=True):
    sdk: Sdk
    payloads: dict[str, Source]


def providers() -> list[str]:
    return sorted(p.name for p in PAYLOADS.iterdir() if p.is_dir())


def provenance(provider: str) -> Provenance:
    return msgspec.convert(tomllib.loads((PAYLOADS / provider / "PROVENANCE.toml").read_text()), Provenance)


def payload_files(provider: str) -> set[str]:
    return {p.name for p in (PAYLOADS / provider).glob("*.json")} - OURS


def model_of(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def validate(model: Any, data: Any) -> Any:
    """`data` parsed with an SDK's model: a pydantic v2 model or any type through a TypeAdapter, a pydantic v1
    model (replicate's SDK is written in `pydantic.v1`, which a TypeAdapter refuses) through its own parse."""
    if isinstance(model, type) and issubclass(model, pydantic_v1.BaseModel):
        return model.parse_obj(data)
    return pydantic.TypeAdapter(model).validate_python(data)
