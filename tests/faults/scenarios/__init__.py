"""Every scenario by name, in the order of the suite's numbering. A scenario is `async (long: bool) -> Row`;
None marks one that is planned but written elsewhere (the runner lists it as not written yet)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.faults.report import Row
from tests.faults.scenarios.nats_faults import cluster_leader, jetstream_unavailable, nats_kill

Scenario = Callable[[bool], Awaitable[Row]]

SCENARIOS: dict[str, Scenario | None] = {
    "jetstream_unavailable": jetstream_unavailable,  # 1
    "nats_kill": nats_kill,  # 2
    "cluster_leader": cluster_leader,  # 3
}
