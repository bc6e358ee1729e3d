"""What the per-provider adapter tests share: the stand-in and the adapter pointed at it as fixtures, the
attempt they submit, the recorded payloads, and waiting for a render to finish or a submit to be refused."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import aiohttp
import asyncpg
import pytest

from tests.stack import Stack, host_port, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common.errors import ErrorCode, JobError, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import ProviderAdapter, ProviderSignal, ProviderState, Submission, SubmitRequest

PAYLOADS = Path(__file__).parent / "payloads"
WAITING = (ProviderState.QUEUED, ProviderState.RUNNING)
S = TypeVar("S")


def wired(start: Callable[[], contextlib.AbstractAsyncContextManager[S]],
          build: Callable[[aiohttp.ClientSession, S], Any], *, name: str = "standin") -> tuple[Any, Any]:
    """A provider's two fixtures: its stand-in (`name`) running for one test, and `adapter`, built by
    `build(http, stand_in)` against it. Bind both in the test module: `standin, adapter = wired(...)`."""

    @pytest.fixture(name=name)
    async def standin() -> AsyncIterator[S]:
        async with start() as running:
            yield running

    @pytest.fixture
    def adapter(http: aiohttp.ClientSession, request: pytest.FixtureRequest) -> Any:
        return build(http, request.getfixturevalue(name))

    return standin, adapter


def recorded(provider: str, name: str) -> bytes:
    """One recorded payload of `provider`, as it came over the wire."""
    return (PAYLOADS / provider / f"{name}.json").read_bytes()


def expected_signals(provider: str) -> list[tuple[str, ProviderState, ErrorCode | None]]:
    """What each recorded status payload of `provider` means: (payload, state, error code), as
    `payloads/<provider>/expected_signals.json` lists them."""
    table = json.loads((PAYLOADS / provider / "expected_signals.json").read_text())
    return [(name, ProviderState(state), ErrorCode(code) if code else None) for name, (state, code) in table.items()]


def failing_scenarios(provider: str, scripts: dict[str, list[str]]) -> list[tuple[str, ErrorCode | None]]:
    """The stand-in's scenarios that end in a failed render, each with the error code its last recorded state
    means: the expectations of a polled stand-in, read from its scripts and the recorded payloads."""
    meaning = {name: (state, code) for name, state, code in expected_signals(provider)}
    ends = {scenario: meaning.get(script[-1]) for scenario, script in scripts.items()}
    return [(scenario, end[1]) for scenario, end in ends.items() if end and end[0] is ProviderState.FAILED]


def outcome(sig: ProviderSignal) -> tuple[str, ProviderState, ErrorCode | None]:
    """What a signal says in brief: whose it is, where it stands, and the error code if it failed."""
    return sig.provider_job_id, sig.state, sig.error.code if sig.error else None


def attempt(request: JobRequest, *, job_id: str = "job_test", number: int = 1, callback_url: str | None = None,
            image_url: str | None = None) -> SubmitRequest:
    return SubmitRequest(job_id=job_id, attempt=number, idempotency_key=f"{job_id}-a{number}", request=request,
                         callback_url=callback_url, input_image_url=image_url)


def requester(provider: str, model: str, prompt: str) -> Callable[..., JobRequest]:
    """A maker of one provider's requests: `request(prompt, model=<its name without the provider>, **fields)`."""
    def request(prompt: str = prompt, model: str = model, **fields: Any) -> JobRequest:
        return JobRequest(model=f"{provider}/{model}", prompt=prompt, **fields)

    return request


class Makers(NamedTuple):
    """A calling provider's test makers: its requests, attempts that call back to its stand-in, its payloads."""

    request: Callable[..., JobRequest]  # `request(prompt, model=..., **fields)`
    submit_request: Callable[..., SubmitRequest]  # `submit_request(standin, request, number=1)`
    raw: Callable[[str], bytes]  # one recorded payload, as it came over the wire


def makers(provider: str, model: str, prompt: str, *, job_id: str) -> Makers:
    """Bind in the test module: `request, submit_request, raw = makers(...)`."""
    return Makers(requester(provider, model, prompt), functools.partial(called_back, job_id=job_id),
                  functools.partial(recorded, provider))


def called_back(standin: Any, request: JobRequest, number: int = 1, job_id: str = "job_test") -> SubmitRequest:
    """An attempt whose callbacks go to the stand-in's own `/_sink`."""
    return attempt(request, job_id=job_id, number=number, callback_url=f"{standin.url}/_sink")


def refused_field(adapter: ProviderAdapter, request: JobRequest) -> str:
    """The field a refusal by `validate` names (its message starts `<field>:`)."""
    with pytest.raises(ProviderError) as caught:
        adapter.validate(request)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    return caught.value.message.split(":", 1)[0]


async def inbox_count(database_url: str, provider: str) -> int:
    """How many callbacks of `provider` the gateway stored."""
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM webhook_inbox WHERE provider = $1", provider)
    finally:
        await conn.close()


async def polls(adapter: ProviderAdapter, provider_job_id: str, count: int) -> list[ProviderSignal]:
    return [await adapter.status(provider_job_id) for _ in range(count)]


async def until_finished(adapter: ProviderAdapter, provider_job_id: str, limit: int = 10) -> ProviderSignal:
    """The first finished signal within `limit` polls, for a stand-in that moves a step per poll."""
    for _ in range(limit):
        sig = await adapter.status(provider_job_id)
        if sig.state not in WAITING:
            return sig
    raise AssertionError(f"{provider_job_id} never finished")


async def finished(adapter: ProviderAdapter, provider_job_id: str) -> ProviderSignal:
    """The first finished signal within ten seconds, for a stand-in that moves on a clock."""
    async def done() -> ProviderSignal | None:
        sig = await adapter.status(provider_job_id)
        return sig if sig.state not in WAITING else None

    return await wait_until(done, within=10, what=f"{provider_job_id} to finish")


async def failed(adapter: ProviderAdapter, req: SubmitRequest) -> JobError:
    """The error of a render that is submitted, polled to its end, and fails."""
    accepted = await adapter.submit(req)
    sig = await until_finished(adapter, accepted.provider_job_id)
    assert sig.state is ProviderState.FAILED and sig.error is not None
    return sig.error


@contextlib.asynccontextmanager
async def polling_stack(tmp_path: Path, database_url: str, nats_url: str, standin_url: str,
                        **provider_settings: Any) -> AsyncIterator[Stack]:
    """The whole stack on a provider that sends no callbacks: only the tapered polls can find the results."""
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=600,
                              download_allow_hosts=host_port(standin_url), **provider_settings)
    async with running_stack(settings) as stack:
        yield stack


async def limited_then_taken(adapter: ProviderAdapter, standin: Any,
                             req: SubmitRequest) -> tuple[ProviderError, Submission]:
    """A submit the polled stand-in rate-limits once, then the same submit again: the refusal and the
    acceptance."""
    standin.refusals = 1
    with pytest.raises(ProviderError) as caught:
        await adapter.submit(req)
    return caught.value, await adapter.submit(req)


async def refusal(adapter: ProviderAdapter, req: SubmitRequest) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await adapter.submit(req)
    return caught.value


def refused_submits(submit_request: Callable[..., SubmitRequest], request: Callable[..., JobRequest],
                    cases: list[tuple[str, ErrorCode, float | None, str]]) -> Callable[..., Any]:
    """A provider's test that each (scenario, code, wait, words) case, the scenario named in the prompt, has the
    stand-in refuse the submit with that code and wait, in words that include `words`. Bind it in the test
    module under a `test_` name; its `adapter` and `standin` fixtures are that module's."""

    @pytest.mark.parametrize(("scenario", "code", "wait", "words"), cases)
    async def test(adapter: ProviderAdapter, standin: Any, scenario: str, code: ErrorCode, wait: float | None,
                   words: str) -> None:
        err = await refusal(adapter, submit_request(standin, request(f"a fox standin:{scenario}")))

        assert (err.code, err.retry_after, words in err.message) == (code, wait, True)

    return test
