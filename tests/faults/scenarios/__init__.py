"""Every scenario by name, in the order of the suite's numbering. A scenario is `async (long: bool) -> Row`;
None marks one that is planned but written elsewhere (the runner lists it as not written yet)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.faults.report import Row
from tests.faults.scenarios.duplicate_faults import duplicate_storm
from tests.faults.scenarios.failover_faults import failover_async, failover_sync
from tests.faults.scenarios.io_stall_faults import provider_stall, s3_stall
from tests.faults.scenarios.lock_faults import advisory_lock_held
from tests.faults.scenarios.media_faults import poison_download
from tests.faults.scenarios.nats_faults import cluster_leader, jetstream_unavailable, nats_kill
from tests.faults.scenarios.postgres_faults import postgres_restart
from tests.faults.scenarios.provider_faults import unclear_submits_key_only, unclear_submits_lookup
from tests.faults.scenarios.queue_faults import waiting_queue
from tests.faults.scenarios.stall_faults import jetstream_stall, postgres_stall
from tests.faults.scenarios.storage_faults import object_store_outage_file, object_store_outage_s3

Scenario = Callable[[bool], Awaitable[Row]]

SCENARIOS: dict[str, Scenario | None] = {
    "jetstream_unavailable": jetstream_unavailable,  # 1
    "nats_kill": nats_kill,  # 2
    "cluster_leader": cluster_leader,  # 3
    "postgres_restart": postgres_restart,  # 4
    "object_store_outage_file": object_store_outage_file,  # 5, filesystem backend
    "object_store_outage_s3": object_store_outage_s3,  # 5, S3 backend (moto)
    "advisory_lock_held": advisory_lock_held,  # 6
    "unclear_submits_lookup": unclear_submits_lookup,  # 7, the render looked up before a resubmit
    "unclear_submits_key_only": unclear_submits_key_only,  # 7, only the idempotency key
    "poison_download": poison_download,  # 8
    "waiting_queue": waiting_queue,  # 9
    "duplicate_storm": duplicate_storm,  # 10
    "s3_stall": s3_stall,  # 12, the S3 server accepts connections and does not answer
    "provider_stall": provider_stall,  # 12, the provider accepts connections and does not answer
    "postgres_stall": postgres_stall,  # 11, every PostgreSQL process stopped (SIGSTOP)
    "jetstream_stall": jetstream_stall,  # 11, the work stream's leader stopped in a cluster
    "failover_sync": failover_sync,  # 13, the primary killed and its synchronous standby promoted
    "failover_async": failover_async,  # 13, the same with an asynchronous standby 4 s behind: a measurement
}
# Measurements rather than promises: run by hand (`python -m tests.faults failover_async`) or with the long
# versions, not in the default test run.
MEASUREMENTS = frozenset({"failover_async"})
