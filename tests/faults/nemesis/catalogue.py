"""How each kind of fault in schedule.py begins and ends on a running stack. A fault is begun, and later ended
(an instant one, a SIGKILL, has nothing to end); `Catalogue.heal` ends whatever is still under way, so a run
that fails half way never leaves a server stopped.

What each kind does:
- `kill_service`, `kill_gateway`: SIGKILL to the process; its supervisor starts it again, as Kubernetes would.
- `freeze_service`: SIGSTOP, later SIGCONT (a process that stops answering without dying: a GC pause, a stuck
  disk); its connections stay open.
- `kill_nats_node`: one node of the three-node cluster SIGKILLed, started again later on the same store.
- `freeze_nats_node`: one node stopped (SIGSTOP) and resumed.
- `stall_postgres`: every process of the PostgreSQL that takes writes stopped and resumed; `restart_postgres`:
  an immediate shutdown of it (as after a crash: no checkpoint, every connection cut) and a start, at once.
- `failover_postgres`: the primary's node dies (every process SIGKILLed) and its synchronous standby is
  promoted, as CloudNativePG fails over; the services follow through their multi-host URL. Once a run.
- `object_store_failing`, `object_store_unavailable`: every S3 request answered 500 `InternalError` or 503
  `SlowDown` by the front the services reach moto through (tests/faults/s3front.py).
- `partition_postgres`, `partition_nats_node`: the TCP proxies between the services and PostgreSQL (both servers
  of the pair), or one NATS node, swallow everything and answer nothing; at the end the connections that lived
  through it are reset (network.py). `slow_postgres`: 100 ms each way, with up to 50 ms of jitter, for a while.
- `stall_object_store`: the S3 server (moto) stopped and resumed. It is never killed: moto keeps its objects
  in memory, and a store that forgets what it acknowledged is not a fault the system can be asked to survive.
- `stall_provider`: the fake provider's process stopped and resumed (it is never killed either: its renders
  live in its memory, as a real provider's live on its side).
- `provider_*`, `callbacks_*`: the fake provider's weather (docs/FAKE_PROVIDER.md): slow, refusing with 429,
  503 or 500, its callbacks sent twice or late."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from tests.faults.natsd import NatsCluster
from tests.faults.nemesis import network
from tests.faults.nemesis.network import Network
from tests.faults.nemesis.schedule import Planned
from tests.faults.objectstore import RestartableMoto
from tests.faults.proxy import ProxyThread
from tests.faults.replica import ReplicatedPostgres
from tests.faults.s3front import S3Front
from tests.faults.stall import freeze, thaw
from vidjobs.cli.supervisor import Supervisor

Ending = Callable[[], Awaitable[None]]
WEATHER = {
    "provider_slow": {"api": "slow", "delay_s": 3.0},
    "provider_rate_limited": {"api": "rate_limited"},
    "provider_unavailable": {"api": "unavailable"},
    "provider_failing": {"api": "failing"},
    "callbacks_twice": {"callbacks": "twice"},
    "callbacks_late": {"callbacks": "late", "delay_s": 5.0},
}


async def _nothing() -> None:
    return None


@dataclass
class Catalogue:
    supervisor: Supervisor
    postgres: ReplicatedPostgres
    cluster: NatsCluster
    moto: RestartableMoto
    front: S3Front
    provider_url: str
    session: aiohttp.ClientSession
    network: Network
    under_way: dict[Planned, Ending] = field(default_factory=dict)

    async def begin(self, fault: Planned) -> None:
        if fault.kind in WEATHER:
            self.under_way[fault] = await self._set_weather(WEATHER[fault.kind])
            return
        begin: Callable[[str], Awaitable[Ending]] = getattr(self, f"_{fault.kind}")
        self.under_way[fault] = await begin(fault.target)

    async def end(self, fault: Planned) -> None:
        ending = self.under_way.pop(fault, None)
        if ending is not None:
            await ending()

    async def heal(self) -> None:
        """End every fault still under way, the order they began."""
        for fault in list(self.under_way):
            await self.end(fault)

    # processes of the stack

    def _service_pid(self, name: str) -> int | None:
        return self.supervisor.pid(name)

    async def _kill_service(self, name: str) -> Ending:
        pid = self._service_pid(name)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        return _nothing

    _kill_gateway = _kill_service

    async def _freeze_service(self, name: str) -> Ending:
        pid = self._service_pid(name)
        stopped = freeze(pid) if pid is not None else []
        return _thawing(stopped)

    # NATS

    async def _kill_nats_node(self, name: str) -> Ending:
        node = self.cluster.node(name)
        await asyncio.to_thread(node.kill)

        async def start_again() -> None:
            await asyncio.to_thread(node.start)
        return start_again

    async def _freeze_nats_node(self, name: str) -> Ending:
        return _thawing(freeze(self.cluster.node(name).pid))

    # PostgreSQL, the object store, the provider

    async def _stall_postgres(self, _: str) -> Ending:
        return _thawing(freeze(self.postgres.pid))

    async def _restart_postgres(self, _: str) -> Ending:
        await asyncio.to_thread(self.postgres.writer().restart, "immediate")
        return _nothing

    async def _failover_postgres(self, _: str) -> Ending:
        await asyncio.to_thread(self.postgres.fail_over)
        return _nothing

    def _postgres_proxies(self) -> list[ProxyThread]:
        return [self.network.of(server.port) for server in (self.postgres.primary, self.postgres.standby)]

    async def _partition_postgres(self, _: str) -> Ending:
        return await self._partitioned(self._postgres_proxies())

    async def _partition_nats_node(self, name: str) -> Ending:
        return await self._partitioned([self.network.of(self.cluster.node(name).port)])

    async def _partitioned(self, proxies: list[ProxyThread]) -> Ending:
        await asyncio.to_thread(network.partition, proxies)

        async def mend() -> None:
            await asyncio.to_thread(network.mend, proxies, reset=True)
        return mend

    async def _slow_postgres(self, _: str) -> Ending:
        proxies = self._postgres_proxies()
        await asyncio.to_thread(network.slow, proxies, 0.1)

        async def mend() -> None:
            await asyncio.to_thread(network.mend, proxies, reset=False)
        return mend

    async def _stall_object_store(self, _: str) -> Ending:
        assert self.moto.server is not None
        return _thawing(freeze(self.moto.server.proc.pid))

    async def _object_store_failing(self, _: str) -> Ending:
        return self._failing_store(500)

    async def _object_store_unavailable(self, _: str) -> Ending:
        return self._failing_store(503)

    def _failing_store(self, status: int) -> Ending:
        self.front.fail(status)

        async def mend() -> None:
            self.front.mend()
        return mend

    async def _stall_provider(self, _: str) -> Ending:
        pid = self._service_pid("fake-provider")
        return _thawing(freeze(pid) if pid is not None else [])

    async def _weather(self, weather: dict[str, object]) -> None:
        async with self.session.put(f"{self.provider_url}/v1/_weather", json=weather) as resp:
            resp.raise_for_status()

    async def _set_weather(self, weather: dict[str, object]) -> Ending:
        await self._weather(weather)
        return lambda: self._weather({})


def _thawing(stopped: list[int]) -> Ending:
    async def resume() -> None:
        thaw(stopped)
    return resume
