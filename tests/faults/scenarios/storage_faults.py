"""The object store unavailable while renders are being copied into it: the filesystem backend's root made
unusable, and the S3 server (moto) down. Downloads must wait it out, not fail the jobs."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

from tests.faults.harness import blocking, fault_run, under_fault
from tests.faults.objectstore import RestartableMoto, break_root, mend_root, running_moto
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick

BUCKET = "vidjobs-faults"
# Renders end a few seconds in, so the outage catches jobs reaching the download stage all through it.
OUTAGE = (Plan(jobs=16, over_s=10, at_s=3, lasts_s=20, settle_s=60, render_s=1.5),
          Plan.long(jobs=100, over_s=80, at_s=5, lasts_s=90, settle_s=300, render_s=2))


async def object_store_outage_file(long: bool = False) -> Row:
    plan = pick(*OUTAGE, long)
    async with fault_run("object_store_outage_file") as run:
        root = Path(run.stack.settings.storage_location().removeprefix("file://"))
        await under_fault(run, plan, begin=blocking(partial(break_root, root)), end=blocking(partial(mend_root, root)))
        run.expect_healthy_outcome()
    return run.row


async def object_store_outage_s3(long: bool = False) -> Row:
    plan = pick(*OUTAGE, long)
    async with running_moto(BUCKET) as moto:
        return await _s3_run(moto, plan)


async def _s3_run(moto: RestartableMoto, plan: Plan) -> Row:
    async with fault_run("object_store_outage_s3", storage_url=f"s3://{BUCKET}/faults") as run:
        try:
            await under_fault(run, plan, begin=blocking(moto.stop), end=blocking(moto.start))
        finally:
            shutil.copy(moto.home / "moto.log", run.log_dir / "moto.log")
        run.expect_healthy_outcome()
        run.row.notes.append("moto keeps no state across its restart: the bucket is made again, empty")
    return run.row
