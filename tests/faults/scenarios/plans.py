"""The numbers of one scenario run; each scenario has a short plan (the default test run) and a long one."""

from __future__ import annotations

from dataclasses import dataclass

from tests.faults.workload import Workload


@dataclass(frozen=True)
class Plan:
    jobs: int
    over_s: float  # creates are spread over this long
    at_s: float  # the fault begins this long after the first create
    lasts_s: float  # and ends this much later
    settle_s: float  # after the last create, how long jobs get to end
    render_s: float = 1.0
    # Settling stops early once no job has moved for this long: past an ack wait (10 s), several recovery
    # intervals (5 s) and a supervisor restart.
    stall_s: float = 20.0

    @classmethod
    def long(cls, **numbers: float) -> Plan:
        """Long runs give the safety nets more time before calling a quiet queue stuck."""
        return cls(**{"stall_s": 60.0, **numbers})  # type: ignore[arg-type]

    def workload(self) -> Workload:
        return Workload(self.jobs, self.over_s, render_s=self.render_s)


def pick(short: Plan, long: Plan, is_long: bool) -> Plan:
    return long if is_long else short
