"""Checks several adapters make of a request before any call, each refusal naming the field at fault."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest

M = TypeVar("M")


def invalid(message: str) -> ProviderError:
    """A request this provider cannot take; `message` starts with the field (`duration_s: ...`)."""
    return ProviderError(ErrorCode.INVALID_INPUT, message)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def listed(values: tuple[int, ...]) -> str:
    """`2 to 10` for a run of three or more, else `5 or 10`."""
    if len(values) > 2 and values == tuple(range(values[0], values[-1] + 1)):
        return f"{values[0]} to {values[-1]}"
    return " or ".join(str(v) for v in values)


def pick_model(provider: str, title: str, name: str, models: Mapping[str, M]) -> M:
    """The model a job names, or a refusal listing the ones offered."""
    if name not in models:
        known = ", ".join(f"{provider}/{m}" for m in models)
        raise invalid(f"model: {provider}/{name} is not a {title} model we offer (one of {known})")
    return models[name]


def check_frame(model_id: str, frames: Iterable[tuple[str, str]], request: JobRequest) -> None:
    """Refuse an (aspect ratio, resolution) pair the model does not render, naming the field that is off."""
    frames = list(frames)
    if (request.aspect_ratio, request.resolution) in frames:
        return
    offered = ", ".join(f"{a} at {r}" for a, r in frames)
    field_name = "resolution" if any(a == request.aspect_ratio for a, _ in frames) else "aspect_ratio"
    raise invalid(f"{field_name}: {model_id} cannot render {request.aspect_ratio} at {request.resolution}; "
                  f"it renders {offered}")
