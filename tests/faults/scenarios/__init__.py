"""Every scenario by name, in the order of the suite's numbering. A scenario is `async (long: bool) -> Row`;
None marks one that is planned but written elsewhere (the runner lists it as not written yet)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.faults.report import Row
from tests.faults.scenarios.duplicate_faults import duplicate_storm
from tests.faults.scenarios.nats_faults import cluster_leader, jetstream_unavailable, nats_kill
from tests.faults.scenarios.postgres_faults import postgres_restart
from tests.faults.scenarios.queue_faults import waiting_queue
from tests.faults.scenarios.storage_faults import object_store_outage_file, object_store_outage_s3

Scenario = Callable[[bool], Awaitable[Row]]

SCENARIOS: dict[str, Scenario | None] = {
    "jetstream_unavailable": jetstream_unavailable,  # 1
    "nats_kill": nats_kill,  # 2
    "cluster_leader": cluster_leader,  # 3
    "postgres_restart": postgres_restart,  # 4
    "object_store_outage_file": object_store_outage_file,  # 5, filesystem backend
    "object_store_outage_s3": object_store_outage_s3,  # 5, S3 backend (moto)
    # 6-8 are written elsewhere; their functions go here under these names.
    "advisory_lock_held": None,  # 6: a session holds the provider advisory lock for 7 minutes
    "unclear_submits": None,  # 7: accept_then_timeout / accept_then_drop on 20% of submits
    "poison_download": None,  # 8: a download that kills the media process
    "waiting_queue": waiting_queue,  # 9
    "duplicate_storm": duplicate_storm,  # 10
}
