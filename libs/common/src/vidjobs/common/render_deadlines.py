"""How long a render may take: each model's own deadline, from what this deployment measured of its renders.

A render's deadline runs from its submission. It is the p99 of how long the model's recent renders held their
provider slot (submitted to the render leaving the provider; the very measurements the estimates of waiting
jobs use, vidjobs.common.measurements, read at most once per model and `estimate_refresh_s`), times
1 + margin, kept between a floor and a ceiling. While too few renders are measured (a new model, a quiet
one) the fixed `unmeasured_s` (VIDJOBS_RENDER_DEADLINE_S) holds instead. Each part can be set per provider
(VIDJOBS_RENDER_DEADLINES); the model names its provider.

Only completed renders are measured: one that timed out says nothing about how long a render takes, and
counting it would push the deadline out behind every hung render.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import msgspec

from vidjobs.common.measurements import Conn, Measured, read_measured
from vidjobs.common.settings import Settings


class DeadlineRule(msgspec.Struct, frozen=True, kw_only=True):
    """The deadline policy of one provider, its overrides over the global settings."""

    floor_s: float
    ceiling_s: float
    margin: float
    unmeasured_s: float
    min_samples: int

    @classmethod
    def for_provider(cls, settings: Settings, provider: str) -> DeadlineRule:
        rule = cls(floor_s=settings.render_deadline_floor_s, ceiling_s=settings.render_deadline_ceiling_s,
                   margin=settings.render_deadline_margin, unmeasured_s=settings.render_deadline_s,
                   min_samples=settings.render_deadline_min_samples)
        own = settings.render_deadlines.get(provider)
        if own is None:
            return rule
        changes = {k: v for k, v in msgspec.to_builtins(own).items() if v is not None}
        return msgspec.structs.replace(rule, **changes)


class RenderDeadline(msgspec.Struct, frozen=True, kw_only=True):
    seconds: float  # from submission
    samples: int  # renders of the model it was measured from
    p99_s: float | None  # None: too few renders measured, the fixed deadline holds
    # When a render should be done, from submission: the model's median here (None while unmeasured). A render
    # nobody hears from is first looked at then (vidjobs.common.recovery_checks).
    expected_s: float | None = None

    def at(self, submitted: datetime) -> datetime:
        return submitted + timedelta(seconds=self.seconds)

    def said(self) -> str:
        """In words, for a job's error message and the logs."""
        if self.p99_s is None:
            return f"{self.seconds:.0f} s"
        return f"{self.seconds:.0f} s (its model's renders here take up to {self.p99_s:.0f} s)"


def deadline_for(model: str, measured: Measured, settings: Settings) -> RenderDeadline:
    """The deadline of a render of `model`, from its measured renders."""
    rule = DeadlineRule.for_provider(settings, model.split("/", 1)[0])
    if measured.samples < max(1, rule.min_samples):
        return RenderDeadline(seconds=rule.unmeasured_s, samples=measured.samples, p99_s=None)
    # The ceiling wins over a floor set above it: it is the most anyone agreed to wait.
    seconds = min(rule.ceiling_s, max(rule.floor_s, measured.hold_p99_s * (1 + rule.margin)))
    return RenderDeadline(seconds=seconds, samples=measured.samples, p99_s=measured.hold_p99_s,
                          expected_s=min(seconds, measured.hold_p50_s))


class RenderDeadlines:
    """Deadlines for the renders a process starts: each model's measurements read at most once per
    `estimate_refresh_s`, however many of its renders start (two starting together may both read)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._measured: dict[str, tuple[float, Measured]] = {}  # model -> (fresh until, figures)

    async def for_model(self, conn: Conn, model: str) -> RenderDeadline:
        return deadline_for(model, await self._read(conn, model), self._settings)

    async def _read(self, conn: Conn, model: str) -> Measured:
        now = self._clock()
        kept = self._measured.get(model)
        if kept is not None and kept[0] > now:
            return kept[1]
        measured = await read_measured(conn, model, self._settings)
        self._measured[model] = (now + self._settings.estimate_refresh_s, measured)  # one entry per model
        return measured


async def render_deadline(deadlines: RenderDeadlines | None, conn: Conn, settings: Settings,
                          model: str) -> RenderDeadline:
    """The deadline of a render of `model` starting now; the fixed one where the process measures none."""
    if deadlines is None:
        return RenderDeadline(seconds=DeadlineRule.for_provider(settings, model.split("/", 1)[0]).unmeasured_s,
                              samples=0, p99_s=None)
    return await deadlines.for_model(conn, model)
