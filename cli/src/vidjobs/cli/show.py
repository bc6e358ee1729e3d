"""How the commands that talk to the API show things: tables and a live stage line for a person at a
terminal (on stderr, so stdout stays clean), JSON with `--json`, and plain, quiet lines when piped."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import datetime
from types import TracebackType

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from vidjobs_client.models import STAGES, Job

# What a person can do about each way a job fails; the job's own message says what happened.
WHAT_TO_DO = {
    "content_rejected": "change the prompt (or the input image) and render again",
    "provider_unavailable": "the provider could not take it; render again later",
    "timeout": "the render took too long; render again, perhaps shorter",
    "render_timeout": "the provider took longer than its renders here do, and it was stopped; "
                      "`vidjobs render --again JOB_ID` renders it again",
    "download_failed": "the finished render could not be copied; render again",
    "verification_failed": "the finished render was not a usable video; render again",
    "quota_exhausted": "out of credit, as the message says whose: the account's (`vidjobs account` shows it), or "
                       "ours with the provider (render again later)",
    "provider_misconfigured": "the provider refused our key or our call; the operators are alerted: render again "
                              "once it is fixed",
    "rate_limited": "too much at once; render again in a moment",
    "canceled": "it was canceled; render again if you still want it",
    "invalid_input": "the request was refused as it stands; the message names what to change",
    "internal": "something failed on our side; quote the job id when asking about it",
}

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def interactive() -> bool:
    """Whether a person watches: live displays go to stderr only when it is a terminal."""
    return sys.stderr.isatty()


def json_line(value: object) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")
    sys.stdout.flush()


def spans(numbers: list[int]) -> str:
    """1,2,3,5,8,9 as 1-3,5,8-9."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def _when(at: datetime | None) -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if at else "-"


def _credits(job: Job) -> str:
    actual = job.cost.actual_credits
    return f"{actual} credits" if actual is not None else f"≤{job.cost.estimated_credits} credits"


def stages(job: Job) -> str:
    """The stage line: where the job is, among the stages it passes through."""
    if job.stage not in STAGES:
        return f"[bold red]{job.stage}[/]"
    parts = []
    for stage in STAGES:
        if stage == job.stage:
            extra = f" {job.progress:.0%}" if job.progress is not None and stage == "rendering" else ""
            place = f" #{job.queue_position}" if job.queue_position and stage == "queued" else ""
            parts.append(f"[bold cyan]{stage}{extra}{place}[/]")
        else:
            parts.append(f"[dim]{stage}[/]")
    return " › ".join(parts)


def waiting(job: Job) -> str | None:
    """A waiting job's estimate in words: jobs ahead, when it starts and when it is ready, or why no one can
    say yet."""
    if job.status != "pending" or job.estimate is None:
        return None
    return job.estimate.describe()


def rendering(job: Job) -> str | None:
    """A rendering job's range in words: when it is likely to be ready, or why no one can say."""
    if job.status not in ("submitted", "processing") or job.ready is None:
        return None
    return job.ready.describe()


def retried(job: Job) -> str | None:
    """Which attempt a retried job is on and what ended the one before, in words."""
    return None if job.retry is None else job.retry.describe(job.attempt, retrying=job.status == "retrying")


def expected(job: Job) -> str | None:
    """What the live line adds to the stages: the attempt, once retried, and when it is likely to start or to
    be ready."""
    said = [text for text in (retried(job), waiting(job), rendering(job)) if text]
    return "; ".join(said) or None


def failure(job: Job) -> str:
    if job.error is None:
        return f"job {job.id} {job.status}"
    hint = WHAT_TO_DO.get(job.error.code, "render again, or quote the job id when asking about it")
    return f"job {job.id} {job.status}: {job.error.code}: {job.error.message}\n  what to do: {hint}"


def job_details(job: Job) -> None:
    rows = [("id", job.id), ("status", f"{job.status} ({job.stage})"), ("model", job.model),
            ("prompt", job.prompt), ("cost", _credits(job)), ("created", _when(job.created_at)),
            ("completed", _when(job.completed_at))]
    if job.status == "pending" and job.fallback_models:
        wait = f", after {job.max_wait_s} s of estimated wait" if job.max_wait_s else ""
        rows.append(("may move to", ", ".join(job.fallback_models) + f" (if its provider is down{wait})"))
    if job.priority != "interactive":  # the default lane goes without saying
        rows.insert(2, ("priority", job.priority))
    if job.queue_position and job.status == "pending":
        rows.append(("queue", f"number {job.queue_position} in your queue"
                              + (f"; {job.queue_reason}" if job.queue_reason else "")))
    if (estimate := waiting(job)) is not None:
        rows.append(("estimate", estimate))
    if (ready := rendering(job)) is not None:
        rows.append(("estimate", ready))
    if (attempt := retried(job)) is not None:
        rows.append(("attempt", attempt))
    if job.rerun_of:
        rows.insert(3, ("renders again", job.rerun_of))
    if job.deadline_at and job.status in ("submitted", "processing"):
        rows.append(("deadline", _when(job.deadline_at)))
    if job.error:
        rows.append(("error", f"{job.error.code}: {job.error.message}"))
    if job.outputs:
        o = job.outputs
        rows += [("video", f"{o.width}x{o.height}, {o.duration_s:g} s, {o.bytes} bytes, sha256 {o.sha256}"),
                 ("video url", o.video_url or "(expired)"), ("links expire", _when(o.expires_at))]
    table = Table.grid(padding=(0, 2))
    for name, value in rows:
        table.add_row(f"[dim]{name}[/]", escape(value))
    out.print(table)


def job_table(jobs: Iterable[Job]) -> None:
    rows = [[job.id, job.status, job.stage, job.model, _credits(job), _when(job.created_at), escape(job.prompt)]
            for job in jobs]
    names = ["ID", "STATUS", "STAGE", "MODEL", "COST", "CREATED", "PROMPT"]
    table = Table(box=None, pad_edge=False)
    for i, name in enumerate(names[:-1]):  # these are shown whole (an id is copied); the prompt gives way
        table.add_column(name, no_wrap=True, min_width=max([len(name)] + [len(row[i]) for row in rows]))
    table.add_column(names[-1], overflow="ellipsis", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    out.print(table)


class StageLine:
    """A live line on the terminal: spinner, stages, the provider's progress, time elapsed."""

    def __init__(self, job_id: str) -> None:
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.fields[job]}"), TextColumn("{task.description}"),
                                  BarColumn(bar_width=20), TaskProgressColumn(), TimeElapsedColumn(), console=err)
        self._task: TaskID = self._progress.add_task("", total=1.0, job=job_id)

    def __enter__(self) -> StageLine:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def update(self, job: Job) -> None:
        # A render without the provider's own figure pulses rather than claiming 0 %.
        total = None if job.stage == "rendering" and job.progress is None else 1.0
        done = 1.0 if job.stage == "ready" else job.progress or 0.0
        estimate = expected(job)
        description = stages(job) + (f"  [dim]{escape(estimate)}[/]" if estimate else "")
        self._progress.update(self._task, description=description, completed=done, total=total)


class Transfer:
    """A download's progress bar on the terminal."""

    def __init__(self, name: str) -> None:
        self._progress = Progress(TextColumn(f"downloading {escape(name)}"), BarColumn(bar_width=30),
                                  DownloadColumn(), TransferSpeedColumn(), console=err)
        self._task: TaskID = self._progress.add_task("", total=None)

    def __enter__(self) -> Transfer:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def update(self, done: int, total: int | None) -> None:
        self._progress.update(self._task, completed=done, total=total)
