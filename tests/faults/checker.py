"""The history checker: at quiescence after a fault run, every promise of the product held over the WHOLE
history the load made (history.py), not a sample. Each promise is its own function (promises.py, stored.py,
letters.py); this module reads what they judge, once, and runs them all.

Run it once the load has stopped and the jobs have settled: it reads a still world."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tests.faults import letters, promises, snapshot, stored
from tests.faults.collector import provider_counters
from tests.faults.history import History, Receipt, Violation
from vidjobs.storage.factory import open_storage

if TYPE_CHECKING:
    from tests.faults.harness import FaultRun

__all__ = ["PROMISES", "History", "Receipt", "Violation", "check_history"]

# Every `Violation.promise` the checker reports, in the order the promises are checked.
PROMISES = (
    "job_accounted",  # 1. an acknowledged job exists and ended, or waits saying why; a deleted one is deleted
    "trail_legal",  # 2. each trail is a path of the state machine, its stage never going back
    "one_render_per_attempt",  # 3. the provider rendered no attempt twice
    "outputs_stored",  # 4. a completed job's video, thumbnail and preview are stored as recorded
    "money",  # 5. balances moved by charges and grants only; the ledger sums to them; nothing reserved at rest
    "webhook_delivered",  # 6. each promised app event reached its endpoint, or is recorded retrying or given up
    "webhook_own_account",  # 6. ... and never reached another account's endpoint
    "webhook_signed",  # 6. ... signed with its endpoint's secret
    "dead_letters_explained",  # 7. every dead letter has a reason the checker accepts
    "no_restart_loop",  # 8. no service restarted more than promises.MAX_RESTARTS times
    "no_orphans",  # 9. no stored object that no row accounts for, past the orphan sweep's allowance
)


async def check_history(run: FaultRun, history: History, *, killed: dict[str, int] | None = None) -> list[Violation]:
    """Every broken promise over the history, each naming its job (where it has one) and the run's seed.
    `killed`: the times the run itself killed each service (a nemesis's kills are restarts it caused, not a
    restart loop)."""
    settings = run.stack.settings
    snap = await snapshot.read(run.database_url, history)
    counters = await provider_counters(settings.fake_provider_url)
    found = [
        *promises.jobs_accounted(history, snap),
        *promises.trails_legal(snap),
        *promises.one_render_per_attempt(counters.get("renders_by_attempt", {})),
    ]
    storage = open_storage(settings)
    try:
        found += await stored.outputs_stored(storage, snap)
        found += promises.money(history, snap)
        found += promises.webhooks(history, snap)
        found += await letters.letters_explained(await letters.buried(settings.nats_url), run.database_url)
        found += promises.no_restart_loop({name: n - (killed or {}).get(name, 0)
                                           for name, n in run.supervisor.starts.items()})
        found += await stored.no_orphans(storage, run.database_url, settings)
    finally:
        await storage.close()
    return [dataclasses.replace(v, seed=history.seed) for v in found]
