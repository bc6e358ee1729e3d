"""Checks several adapters make of a request before any call, each refusal naming the field at fault."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest

M = TypeVar("M")
Check = Callable[[Any], str | None]  # what is wrong with a `params` value (`must be ...`), or None


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


def boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def number(low: float, high: float, unit: str = "", *, whole: bool = False) -> Check:
    """A number from `low` to `high`: of `unit` (named in the refusal), and a whole one where `whole`."""
    what = ("a whole number" if whole else "a number") + (f" of {unit}" if unit else "")

    def check(value: object) -> str | None:
        ok = is_number(value) and low <= value <= high and (not whole or isinstance(value, int))  # type: ignore[operator]
        return None if ok else f"must be {what} from {low:g} to {high:g}"

    return check


def one_of(*allowed: str) -> Check:
    def check(value: object) -> str | None:
        return None if value in allowed else "must be " + " or ".join(f'"{a}"' for a in allowed)

    return check


def image_url(value: object) -> str | None:
    ok = isinstance(value, str) and value.startswith(("https://", "http://"))
    return None if ok else "must be an http(s) URL of an image"


def check_params(model_id: str, params: Mapping[str, Any], allowed: Mapping[str, Check]) -> None:
    """Refuse a `params` entry the model does not take, or one whose value it cannot."""
    for name, value in params.items():
        if name not in allowed:
            raise invalid(f"params.{name}: not a parameter of {model_id} (it takes {', '.join(allowed) or 'none'})")
        if (problem := allowed[name](value)) is not None:
            raise invalid(f"params.{name}: {problem}, not {value!r}")


UINT32_MAX = 2**32 - 1  # the largest seed of providers that take it as an unsigned 32-bit integer


def check_optional(model_id: str, request: JobRequest, *, seed: bool = False, negative_prompt: bool = False,
                   input_image: bool = True, max_seed: int | None = None) -> None:
    """Refuse the optional fields the model takes no value for, naming each, and a seed outside 0..`max_seed`
    where the provider bounds it."""
    if request.seed is not None and not seed:
        raise invalid(f"seed: {model_id} takes no seed; leave it out")
    if request.seed is not None and max_seed is not None and not 0 <= request.seed <= max_seed:
        raise invalid(f"seed: must be from 0 to {max_seed}")
    if request.negative_prompt and not negative_prompt:
        raise invalid(f"negative_prompt: {model_id} takes no negative prompt; leave it out")
    if request.input_image is not None and not input_image:
        raise invalid(f"input_image: {model_id} takes no input image")


def check_value(field_name: str, value: Any, table: Mapping[Any, Any], model_id: str) -> None:
    """Refuse a value the model's table has no row for, listing the values it takes."""
    if value not in table:
        offered = " or ".join(str(v) for v in table)
        raise invalid(f"{field_name}: {model_id} takes {offered}, not {value}")


def check_duration(model_id: str, durations: Iterable[int], request: JobRequest) -> None:
    durations = tuple(durations)
    if request.duration_s not in durations:
        raise invalid(f"duration_s: {model_id} renders clips of {listed(durations)} seconds, "
                      f"not {request.duration_s}")


def round_up(model_id: str, durations: Iterable[int], request: JobRequest) -> int:
    """The shortest clip length the model makes that is at least as long as asked; a longer ask is refused."""
    durations = sorted(durations)
    length = next((d for d in durations if d >= request.duration_s), None)
    if length is None:
        made = " or ".join(f"{d} s" for d in durations)
        raise invalid(f"duration_s: {model_id} makes {made} clips; {request.duration_s} s is longer")
    return length
