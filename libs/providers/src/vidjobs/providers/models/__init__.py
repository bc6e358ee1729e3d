"""Each provider's model table as data (`<provider>.toml` here): what its models render and take, read once at
import into the Structs its adapter defines, so adding a model is an edit to a table, not to code."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")


def load(provider: str, kind: type[T]) -> T:
    """`<provider>.toml` as `kind`; a table that breaks its schema fails at import, naming the field."""
    return msgspec.toml.decode((Path(__file__).parent / f"{provider}.toml").read_bytes(), type=kind)


def frame_sets(tables: dict[str, dict[str, str]]) -> dict[str, dict[tuple[str, str], str]]:
    """Frame sets as the tables write them (`"16:9 720p" = <the provider's value>`), keyed by (aspect ratio,
    resolution) as a request names them."""
    return {name: {_frame(key): value for key, value in frames.items()} for name, frames in tables.items()}


def _frame(text: str) -> tuple[str, str]:
    ratio, resolution = text.split()
    return ratio, resolution
