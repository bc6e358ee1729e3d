"""The infrastructure fault suite's short versions (tests/faults): each scenario runs the whole stack over
servers of its own, breaks one of them mid-run, and asserts what docs/ARCHITECTURE.md "Faults" promises. The long
versions run with VIDJOBS_FAULTS_LONG=1, or through `python -m tests.faults --long`. Every scenario runs with
a backlog of jobs parked beside its workload and checks it intact afterwards: 200 jobs unless
VIDJOBS_FAULTS_BACKLOG says otherwise (0: none; see tests/faults/backlog.py). Service logs of every run are
kept under VIDJOBS_FAULTS_LOGS (see tests/faults/harness.py)."""

from __future__ import annotations

import os

import pytest

from tests.faults.report import table
from tests.faults.scenarios import SCENARIOS

LONG = os.environ.get("VIDJOBS_FAULTS_LONG") == "1"
WRITTEN = [name for name, scenario in SCENARIOS.items() if scenario is not None]


@pytest.mark.parametrize("name", WRITTEN)
async def test_fault(name: str) -> None:
    scenario = SCENARIOS[name]
    assert scenario is not None
    row = await scenario(LONG)
    print("\n" + table([row]))
    assert row.passed, f"{name}: " + "; ".join(row.broken)
