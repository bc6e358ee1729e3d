"""What the fault scenarios' common expectation (tests.faults.harness.expect_healthy_outcome) accepts, over rows
as the collector fills them: a run whose workload never ran, or whose jobs did not all complete, is no pass."""

from __future__ import annotations

from tests.faults.harness import expect_healthy_outcome
from tests.faults.report import Row


def _judged(**counts: int) -> Row:
    row = Row("scenario", **counts)
    expect_healthy_outcome(row)
    return row


def test_a_run_whose_jobs_all_completed_passes():
    assert _judged(created=20, completed=20).broken == []


def test_a_run_that_created_nothing_fails():
    empty = _judged()

    assert not empty.passed
    assert any("created no jobs" in what for what in empty.broken), empty.broken
    assert any("no job completed" in what for what in empty.broken), empty.broken


def test_a_run_with_jobs_neither_completed_nor_failed_fails():
    # 20 created, 18 completed, none failed or stuck: two ended canceled or expired, which no workload asks for.
    row = _judged(created=20, completed=18)

    assert row.broken == ["2 jobs ended neither completed nor failed (canceled or expired), though nothing "
                          "canceled them"]


def test_failed_stuck_or_repeated_work_fails_as_before():
    row = _judged(created=10, completed=7, failed=1, stuck=2, over_rendered=1, repeated_moves=3)

    assert len(row.broken) == 4, row.broken
    assert [what.split(" ", 1)[0] for what in row.broken] == ["2", "1", "1", "3"]
