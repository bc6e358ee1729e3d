"""One row per scenario run, and the table they make."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    scenario: str
    backlog: int = 0  # jobs parked beside the workload for the whole run (not counted in the columns after it)
    created: int = 0
    completed: int = 0
    failed: int = 0
    stuck: int = 0  # not terminal when the settle wait ended
    refused: int = 0  # creates that never got a 2xx, however often retried
    max_renders_per_attempt: float = 0.0  # over jobs: provider renders / attempts submitted (must be <= 1)
    over_rendered: int = 0  # jobs rendered more often than they had attempts submitted
    repeated_moves: int = 0  # a (from, to) move made twice within one attempt of one job
    recover_s: float | None = None  # fault end -> first completion after it
    drain_s: float | None = None  # fault end -> the last job that did end, ended
    # Scenarios that probe the API while the fault lasts (tests.faults.probes): the longest answer and the
    # 5xx answers by status.
    slowest_s: float | None = None
    server_errors: dict[int, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    broken: list[str] = field(default_factory=list)  # what should have held and did not
    notes: list[str] = field(default_factory=list)  # measurements worth printing under the table

    @property
    def passed(self) -> bool:
        return not self.broken

    def expect(self, holds: bool, what: str) -> None:
        """Record `what` as broken unless it holds; a run reports every broken promise, not just the first."""
        if not holds:
            self.broken.append(what)


COLUMNS = ("scenario", "backlog", "created", "completed", "failed", "stuck", "refused", "renders/att", "over",
           "repeats", "recover_s", "drain_s", "slowest_s", "5xx", "elapsed_s", "result")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _errors(row: Row) -> str:
    if row.slowest_s is None:
        return "-"
    return ",".join(f"{n}x{status}" for status, n in row.server_errors.items()) or "0"


def cells(row: Row) -> tuple[str, ...]:
    return (row.scenario, str(row.backlog), str(row.created), str(row.completed), str(row.failed), str(row.stuck),
            str(row.refused), f"{row.max_renders_per_attempt:.2f}", str(row.over_rendered),
            str(row.repeated_moves), _seconds(row.recover_s), _seconds(row.drain_s), _seconds(row.slowest_s),
            _errors(row), f"{row.elapsed_s:.0f}",
            "PASS" if row.passed else "FAIL")


def table(rows: list[Row]) -> str:
    body = [COLUMNS, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for row in rows:
        for what in row.broken:
            lines.append(f"{row.scenario}: FAILED: {what}")
        for note in row.notes:
            lines.append(f"{row.scenario}: {note}")
    return "\n".join(lines)
