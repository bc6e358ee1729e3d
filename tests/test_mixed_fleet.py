"""A rolling upgrade from the previous release to this checkout, with both versions' services at once over one
PostgreSQL database (migrated by this checkout) and one NATS, and one fake provider.

The previous release is the newest one CHANGELOG.md records that is not this checkout (tests/releases.py),
installed from its commit. A commit missing from the clone, or a tag that disagrees with the changelog, fails
the test; only a package index out of reach (with uv's cache lacking a package) skips it, saying so. Before
anything runs, the migrations this checkout adds are held to the rollout rule (tests/migrationkinds.py): a
contract migration the previous release still needs fails the test, since that release cannot run beside it.

The rollout goes in three steps, so that each kind of hand-over happens for certain rather than by chance:
1. the previous release's workers only, beside both gateways: jobs created on each are submitted by the old
   submitter, whose callbacks go to the new gateway;
2. this checkout's workers come up and the old poller, media and submitter go: those jobs are finished by
   the new ones, and new jobs are submitted by the new submitter, whose callbacks go to the old gateway;
3. the old poller, media and submitter come back (a rollback's first step), so every consumer has two
   processes of two versions on one durable, and more jobs are created on both gateways.

Then: every job completed, readable with its video on both gateways; no answer 500 from either (to the
client, to the provider's callbacks); nothing dead-lettered (every message either version published was
decoded by the other); and no process died."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.js.errors import NotFoundError

from tests import contractdiff, releases, workspace
from tests.fleet import Fleet, IndexOutOfReach, Process, Release, build_release, counter_total, for_release
from tests.migrationkinds import contracts_the_previous_release_needs, numbers_in, read
from tests.stack import assert_every_trail_legal, demo_key, stack_settings
from vidjobs.cli.embedded import free_port
from vidjobs.common import bus

WORKERS = ("submitter", "poller", "media", "reaper")
LEFT_THE_QUEUE = {"submitted", "processing", "downloading", "completed"}
SETTINGS: dict[str, Any] = {"recovery_delay_s": 5, "recovery_interval_s": 5, "ack_wait_s": 10, "log_format": "text"}


@pytest.fixture(scope="module")
def previous_version() -> tuple[str, str]:
    """The previous release's version and full commit, from CHANGELOG.md (checked against its tag, if fetched)."""
    release, commit = releases.previous_release()
    return release.version, commit


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory, previous_version: tuple[str, str]) -> Release:
    version, commit = previous_version
    started = time.monotonic()
    try:
        release = build_release(commit, tmp_path_factory.mktemp("previous-release"))
    except IndexOutOfReach as exc:
        pytest.skip(f"the previous release {version} cannot be installed: {exc}")
    print(f"previous release {version} ({commit[:9]}) installed in {time.monotonic() - started:.1f}s")
    refused = contracts_the_previous_release_needs(numbers_in(release.source), read(workspace.migrations_folder()))
    if refused:
        pytest.fail(f"this checkout cannot roll out beside {version}: " + "; ".join(refused))
    return release


def test_the_recorded_contract_of_the_previous_release_is_what_it_publishes(previous_release, previous_version):
    """docs/contracts/<version>.json, which tests/test_contract.py holds this checkout to, is what that
    release's own code publishes, not a hand-edited copy."""
    version, commit = previous_version
    recorded = contractdiff.recorded(version)
    assert (recorded.pop("release"), recorded.pop("commit")) == (version, commit)
    assert recorded == contractdiff.published_by(previous_release.python, previous_release.source)


class Client:
    """The API as a client sees it, over both gateways, counting every answer's status."""

    def __init__(self, session: aiohttp.ClientSession, key: str):
        self.session = session
        self.auth = {"Authorization": f"Bearer {key}"}
        self.statuses: Counter[int] = Counter()

    async def create(self, gateway: str, model: str, render_s: float) -> str:
        body = {"model": model, "prompt": "a red fox in snow", "duration_s": 1, "params": {"render_s": render_s}}
        async with self.session.post(f"{gateway}/v1/jobs", json=body, headers=self.auth) as resp:
            self.statuses[resp.status] += 1
            data = await resp.json()
            assert resp.status == 201, data
            return str(data["id"])

    async def job(self, gateway: str, job_id: str) -> dict[str, Any]:
        async with self.session.get(f"{gateway}/v1/jobs/{job_id}", headers=self.auth) as resp:
            self.statuses[resp.status] += 1
            data: dict[str, Any] = await resp.json()
            assert resp.status == 200, data
            return data

    async def fetch(self, url: str) -> int:
        async with self.session.get(url) as resp:
            self.statuses[resp.status] += 1
            await resp.read()
            return resp.status

    async def wait_status(self, gateways: list[str], ids: Iterable[str], statuses: set[str], within_s: float) -> None:
        """Until every job is in one of `statuses`, read from each gateway in turn."""
        waiting, deadline, turn = set(ids), time.monotonic() + within_s, 0
        while waiting:
            assert time.monotonic() < deadline, f"not {statuses} within {within_s:.0f}s: {sorted(waiting)}"
            for job_id in list(waiting):
                turn += 1
                if (await self.job(gateways[turn % 2], job_id))["status"] in statuses:
                    waiting.discard(job_id)
            await asyncio.sleep(0.3)


def _processes(release: Release, settings: dict[str, str], old_port: int, new_port: int) -> dict[str, Process]:
    """Two of each service, one per version; the fake provider is this checkout's. Each submitter hands the
    provider the other version's gateway for callbacks."""
    old_url, new_url = f"http://127.0.0.1:{old_port}", f"http://127.0.0.1:{new_port}"
    at = {"VIDJOBS_HTTP_PORT": str(old_port), "VIDJOBS_PUBLIC_URL": old_url}
    processes = {
        "fake-provider": Process("vidjobs.fakeprovider", settings),
        "gateway-new": Process("vidjobs.gateway", {**settings, "VIDJOBS_PUBLIC_URL": new_url}),
        "gateway-old": for_release(release, "vidjobs.gateway", {**settings, **at}),
    }
    for name in WORKERS:
        processes[f"{name}-new"] = Process(f"vidjobs.{name}", settings)
        processes[f"{name}-old"] = for_release(release, f"vidjobs.{name}", settings)
    processes["submitter-new"] = Process("vidjobs.submitter", {**settings, "VIDJOBS_PUBLIC_URL": old_url})
    processes["submitter-old"] = for_release(release, "vidjobs.submitter", {**settings, "VIDJOBS_PUBLIC_URL": new_url})
    return processes


async def _dead_letters(nats_url: str) -> int:
    nc, js = await bus.connect(nats_url, "mixed-fleet-test")
    try:
        return (await js.stream_info(bus.DEAD_STREAM)).state.messages
    except NotFoundError:
        return 0
    finally:
        await nc.close()


async def _up(fleet: Fleet, session: aiohttp.ClientSession, *names: str) -> None:
    for name in names:
        await fleet.start(name)
    await asyncio.gather(*(fleet.wait_ready(session, name) for name in names))


async def _create(client: Client, gateways: list[str], per_gateway: int, render_s: float) -> list[str]:
    models = ("fake/default", "fake-poll/default")  # callbacks, and polling
    return list(await asyncio.gather(*(client.create(g, models[i % 2], render_s)
                                       for g in gateways for i in range(per_gateway))))


@pytest.fixture
async def fleet(previous_release: Release, tmp_path: Path, database_url: str, nats_url: str
                ) -> AsyncIterator[tuple[Fleet, dict[str, str]]]:
    old_port, new_port = free_port(), free_port()
    settings = stack_settings(tmp_path, database_url, nats_url, http_port=new_port, **SETTINGS)
    fleet = Fleet(_processes(previous_release, settings.to_env(), old_port, new_port), log_dir=tmp_path / "logs")
    gateways = {"old": f"http://127.0.0.1:{old_port}", "new": f"http://127.0.0.1:{new_port}"}
    try:
        yield fleet, gateways
    finally:
        await fleet.close(grace_s=10)
        print(f"service logs: {fleet.log_dir}")


async def test_the_previous_release_and_this_one_run_side_by_side(fleet, database_url, nats_url):
    fleet, urls = fleet
    gateways = [urls["old"], urls["new"]]
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        client = Client(session, await demo_key(database_url))
        # 1. The previous release, and the new gateway beside its own.
        await _up(fleet, session, "fake-provider", "gateway-old", "gateway-new", *(f"{w}-old" for w in WORKERS))
        first = await _create(client, gateways, 2, render_s=4)
        await client.wait_status(gateways, first, LEFT_THE_QUEUE, within_s=30)
        # 2. The new workers come up; the old poller, media and submitter go, mid-render. Until now only the old
        # submitter submitted, so its callbacks came to the new gateway; now only the new one does, and its come
        # to the old gateway. Both gateways are then sure to take a provider callback, whichever submitter
        # JetStream hands each job to once both run.
        await _up(fleet, session, *(f"{w}-new" for w in WORKERS))
        await asyncio.gather(fleet.stop("poller-old"), fleet.stop("media-old"), fleet.stop("submitter-old"))
        second = await _create(client, gateways, 2, render_s=0.5)
        await client.wait_status(gateways, first + second, {"completed", "failed", "canceled"}, within_s=60)
        # 3. Both versions of every service.
        await _up(fleet, session, "poller-old", "media-old", "submitter-old")
        third = await _create(client, gateways, 3, render_s=0.5)
        await client.wait_status(gateways, third, {"completed", "failed", "canceled"}, within_s=60)

        jobs = first + second + third
        finals = [await client.job(gateways[i % 2], j) for i, j in enumerate(jobs)]
        assert Counter(j["status"] for j in finals) == {"completed": len(jobs)}, finals
        # Each job read, and its video fetched, through the gateway of the other version than the one above.
        for i, job_id in enumerate(jobs):
            job = await client.job(gateways[(i + 1) % 2], job_id)
            assert await client.fetch(job["outputs"]["video_url"]) == 200, job
        metrics = {name: await fleet.metrics(session, name) for name in ("gateway-old", "gateway-new")}
        handled = {name: counter_total(await fleet.metrics(session, name), "vidjobs_messages_total")
                   for name in fleet.processes if name.split("-")[0] in WORKERS}

    print(f"mixed fleet: {len(jobs)} jobs in {time.monotonic() - started:.1f}s; answers {dict(client.statuses)}; "
          f"work messages handled per process (the old poller, media and submitter since their restart) {handled}")
    assert not [s for s in client.statuses if s >= 500], client.statuses
    for name, text in metrics.items():
        assert counter_total(text, "vidjobs_webhooks_total") > 0, f"no provider callback reached {name}"
        server_errors = [line for line in text.splitlines()
                         if line.startswith("vidjobs_http_requests_total{") and 'status="5' in line]
        assert not server_errors, f"{name} answered 5xx: {server_errors}"
    assert await _dead_letters(nats_url) == 0, "a message one version published was dead-lettered by the other"
    assert handled["poller-new"] > 0 and handled["media-new"] > 0, handled
    restarted = {name: n - 1 for name, n in fleet.starts.items()
                 if n > 1 and name not in ("poller-old", "media-old", "submitter-old")}
    assert not restarted, f"processes died and were restarted: {restarted}"
    await assert_every_trail_legal(database_url)
    print(await _previous_check(fleet.processes["gateway-old"], database_url))


async def _previous_check(gateway: Process, database_url: str) -> str:
    """What the previous release's `migrate --check` (its pods' wait-for-schema) says of this schema: a figure
    for docs/UPGRADES.md, not an expectation (that release's code is fixed)."""
    proc = await asyncio.create_subprocess_exec(
        str(gateway.python), "-m", "vidjobs.cli", "migrate", "--check", cwd=gateway.cwd,
        env={**os.environ, "VIDJOBS_DATABASE_URL": database_url}, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    return f"the previous release's `migrate --check` exits {proc.returncode}: {err.decode().strip()}"
