"""vidjobs.common.backoff through its public API, on a fake clock: a call is made again only for the failures
named, no more often than its attempts allow, never past its time bound, and after waits that grow
exponentially within their jittered bounds."""

from __future__ import annotations

import random

import pytest

from vidjobs.common import backoff
from vidjobs.common.backoff import Backoff


class Flaky(Exception):
    pass


class Broken(Exception):
    pass


class Clock:
    """Time that passes only when a call takes some (`cost_s`) or the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(clock: Clock, errors: list[Exception], *, cost_s: float = 0.0, result: str = "done"):
    """A call that raises `errors` one by one, each call costing `cost_s`, then returns `result`; it
    records the attempt numbers it was given."""
    seen: list[int] = []

    async def call(attempt: int) -> str:
        seen.append(attempt)
        clock.now += cost_s
        if errors:
            raise errors.pop(0)
        return result

    return call, seen


async def run(policy: Backoff, fn, clock: Clock, told: list | None = None):
    def on_backoff(exc: BaseException, attempt: int, wait_s: float) -> None:
        if told is not None:
            told.append((type(exc).__name__, attempt, wait_s))

    return await backoff.call(policy, fn, on_backoff=on_backoff, sleep=clock.sleep, clock=clock)


async def test_a_named_failure_is_repeated_until_the_call_succeeds():
    clock, told = Clock(), []
    fn, seen = failing(clock, [Flaky(), Flaky()])
    assert await run(Backoff(on=Flaky, attempts=5, timeout=None, base=1.0, cap=10.0), fn, clock, told) == "done"
    assert seen == [1, 2, 3]
    assert [(name, attempt) for name, attempt, _ in told] == [("Flaky", 1), ("Flaky", 2)]
    assert [wait for *_, wait in told] == clock.sleeps  # each wait announced is the one slept


async def test_a_failure_not_named_propagates_at_once():
    clock = Clock()
    fn, seen = failing(clock, [Broken("no")])
    with pytest.raises(Broken, match="no"):
        await run(Backoff(on=(Flaky, TimeoutError), attempts=5), fn, clock)
    assert seen == [1] and clock.sleeps == []


async def test_a_predicate_names_failures_a_type_cannot_tell_apart():
    clock = Clock()
    fn, seen = failing(clock, [Flaky("unclear"), Flaky("clear"), Flaky("unclear")])
    with pytest.raises(Flaky, match="^clear$"):
        await run(Backoff(on=lambda exc: str(exc) == "unclear", attempts=5), fn, clock)
    assert seen == [1, 2]


async def test_attempts_bound_the_calls_and_the_last_failure_propagates():
    clock = Clock()
    fn, seen = failing(clock, [Flaky("1"), Flaky("2"), Flaky("3"), Flaky("4")])
    with pytest.raises(Flaky, match="^3$"):
        await run(Backoff(on=Flaky, attempts=3, timeout=None), fn, clock)
    assert seen == [1, 2, 3] and len(clock.sleeps) == 2


async def test_time_bounds_the_calls_however_many_attempts_are_left():
    clock = Clock()
    fn, seen = failing(clock, [Flaky(str(n)) for n in range(100)], cost_s=4.0)
    with pytest.raises(Flaky, match="^2$"):
        await run(Backoff(on=Flaky, attempts=None, timeout=10.0, base=0.5, cap=3.0), fn, clock)
    # Calls of 4 s each, short waits between: the third ends past 10 s, and no fourth starts.
    assert seen == [1, 2, 3] and len(clock.sleeps) == 2


async def test_no_wait_runs_past_the_time_bound():
    random.seed(3)  # a first wait drawn well above the 0.1 s left
    clock = Clock()
    fn, seen = failing(clock, [Flaky(), Flaky()], cost_s=0.9)
    with pytest.raises(Flaky):
        await run(Backoff(on=Flaky, attempts=None, timeout=1.0, base=50.0, cap=50.0), fn, clock)
    # The first call failed 0.9 s in: a wait of up to 50 s is cut to the 0.1 s left.
    assert seen == [1, 2] and clock.sleeps == [pytest.approx(0.1)]


async def test_waits_grow_exponentially_with_full_jitter_up_to_the_cap():
    random.seed(1)
    clock = Clock()
    fn, _ = failing(clock, [Flaky() for _ in range(7)])
    await run(Backoff(on=Flaky, attempts=8, timeout=None, base=0.5, cap=4.0), fn, clock)
    bounds = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert len(clock.sleeps) == len(bounds)
    assert all(0 <= wait <= bound for wait, bound in zip(clock.sleeps, bounds, strict=True)), clock.sleeps


def test_delay_is_uniform_between_zero_and_its_bound():
    random.seed(2)
    waits = [backoff.delay(3, base=1.0, cap=30.0) for _ in range(2000)]
    assert 0 <= min(waits) and max(waits) <= 4.0
    assert 1.8 < sum(waits) / len(waits) < 2.2  # full jitter: the mean is half the bound
    assert max(backoff.delay(40, base=1.0, cap=30.0) for _ in range(200)) <= 30.0


def test_a_policy_without_any_bound_is_refused():
    with pytest.raises(ValueError, match="bound"):
        Backoff(on=Flaky, attempts=None, timeout=None)
    with pytest.raises(ValueError, match="at least 1"):
        Backoff(on=Flaky, attempts=0)
