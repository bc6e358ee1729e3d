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


def frame_key(text: str) -> tuple[str, str]:
    """A frame as the tables write it, `"16:9 720p"`, as (aspect ratio, resolution)."""
    ratio, resolution = text.split()
    return ratio, resolution
