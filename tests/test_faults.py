"""The infrastructure fault suite (tests/faults): each scenario runs the whole stack over servers of its own,
breaks one of them mid-run, and asserts what docs/ARCHITECTURE.md "Faults" promises. The short versions are part
of the default run; the long ones are marked `long` (`pytest -m long tests/test_faults.py`, or
`python -m tests.faults --long`), each with a timeout of its own above the longest run recorded in
docs/RELIABILITY.md. Every scenario runs with a backlog of jobs parked beside its workload and checks it intact
afterwards: 200 jobs unless VIDJOBS_FAULTS_BACKLOG says otherwise (0: none; see tests/faults/backlog.py).
Service logs of every run are kept under VIDJOBS_FAULTS_LOGS (see tests/faults/harness.py)."""

from __future__ import annotations

import pytest

from tests.faults.report import table
from tests.faults.scenarios import MEASUREMENTS, SCENARIOS

# The longest long run recorded (docs/RELIABILITY.md) took 637 s; the global timeout (pyproject.toml) is 300 s.
LONG_TIMEOUT_S = 1800
WRITTEN = [name for name, scenario in SCENARIOS.items() if scenario is not None]
# A measurement (tests.faults.scenarios.MEASUREMENTS) runs with the long versions only.
DEFAULT = [name for name in WRITTEN if name not in MEASUREMENTS]


async def _run(name: str, long: bool) -> None:
    scenario = SCENARIOS[name]
    assert scenario is not None
    row = await scenario(long)
    print("\n" + table([row]))
    assert row.passed, f"{name}: " + "; ".join(row.broken)


@pytest.mark.parametrize("name", DEFAULT)
async def test_fault(name: str) -> None:
    await _run(name, False)


@pytest.mark.long
@pytest.mark.timeout(LONG_TIMEOUT_S)
@pytest.mark.parametrize("name", WRITTEN)
async def test_fault_long(name: str) -> None:
    await _run(name, True)
