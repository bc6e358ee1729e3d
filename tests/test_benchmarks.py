"""Every benchmark in bench/ still runs and prints its report, at a size that takes seconds.

Their figures are read by people, in one sitting, side by side (docs/PERFORMANCE.md); nothing here judges a
time. What is checked is that each script runs against today's code (a renamed statement or a changed
signature breaks a script nobody runs for weeks) and that its report says what the docs say it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# script and arguments -> what its report must hold (multiline regexes)
SMALL_RUNS = {
    "growth": (["--sizes", "300,600", "--runs", "3"], [
        r"^list page \(newest 20\)\s+[\d.]+ / [\d.]+\s+[\d.]+ / [\d.]+\s+[\d.]+x$",
        # A read builds the job's outputs from its asset rows through their unique index, at any size.
        r"^  job GET \(finished\): .*Index Scan assets_one_per_kind",
        r"^  list page \(newest 20\): .*Index Scan jobs_account_listing.*Index Scan assets_one_per_kind",
    ]),
    "claims": (["--deliveries", "200", "--accounts", "4", "--hosts", "20", "--runs", "3"], [
        r"^\s+open(\s+[\d.]+){2}\s+\d+\s+\d+\s+[\d.]+\s+\d+$", r"^\s+full\s", r"^\s+hosts\s",
    ]),
    "dispatch": (["--depths", "5,10", "--runs", "5", "--accounts", "2"], [
        r"^\s+10\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\w+$",
    ]),
    "reads": (["--seconds", "1", "--rounds", "1", "-c", "4"], [
        r"^round 1 ours:\s+\d+ req/s", r"^round 1 bare:\s+\d+ req/s", r"median req/s: [\d.]+$",
    ]),
    "backlog": (["--sizes", "40", "--accounts", "4", "--quota", "2", "--idle-s", "1", "--settle-s", "1",
                 "--measure-s", "2", "--drain-s", "3", "--requests", "3"], [
        r"^\s+40(\s+-?[\d.]+)+$",  # CPU above idle by process, and its total
        r"^\s+40\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+ ->\s+[\d.]+\s+[\d.]+ ->\s+[\d.]+$",
        r"^rows per waiting job at 40: jobs 1\.00, job_transitions",
    ]),
    "streams": (["--accounts", "3", "--jobs-per-account", "4", "--streams", "12", "--render-s", "0.5",
                 "--idle-streams", "5", "--idle-s", "3"], [
        r"^  streams: \d+/12 opened, refused .*; saw the final state \d+, ended early .*, still open at the end \d+",
        r"^  GET /v1/jobs/\{id\} meanwhile \(10/s, another account\): p50 [\d.]+ ms  p99 [\d.]+ ms",
        r"^  GET /healthz meanwhile .*: p50 [\d.]+ ms  p99 [\d.]+ ms; the probe's own timer late by p50 [\d.]+ ms",
        r"^  the gateways' full garbage collections: \d+, \d+ of them over 100 ms, [\d.]+ s in all$",
        # Counted from the log of the tests' PostgreSQL, in the benchmark's scratch database only.
        r"^  statements per job state change: [\d.]+ \(\d+ statements, \d+ transitions",
        r"^gateway statements/change\s+[\d.]+$", r"^idle CPU s/stream/min\s+-?[\d.]+$",
        r"^idle RSS KiB/stream\s+-?[\d.]+$", r"^idle statements/stream/min\s+-?[\d.]+$",
    ]),
    "lifecycle": (["-n", "20"], [r"^per job: xact_commit [\d.]+", r"^\s+total\s+[\d.]+ ms$"]),
    # The ffmpeg comparison needs the [bench] extra's ffmpeg; the test run may not have it.
    "media": (["--rounds", "2", "--big-rounds", "1", "--sizes", "720p:5", "--kind", "provider"], [
        r"^derive, 5 s 720p provider\s+median\s+[\d.]+ ms", r"^floor, 5 s 720p provider\s+median\s+[\d.]+ ms",
        r"^round 1 5 s 720p provider: ours\s+[\d.]+ ms  floor\s+[\d.]+ ms",
    ]),
    "media_steps": (["--clip", "720p", "--rounds", "1"], [
        r"^  derive\s+cpu\s+[\d.]+ \([\d.]+-[\d.]+\)\s+wall\s+[\d.]+$", r"^  whole copy\s+cpu\s+[\d.]+",
    ]),
    "media_isolation": (["--mb", "4", "--burst", "1"], [r"^download alone\s+[\d.]+ s\s+x 1\.00"]),
    # Makes its own primary and standby (tests/faults/replica.py) rather than use the test server.
    "replication": (["--seconds", "1", "--rounds", "1", "-c", "2"], [
        r"^round 1 sync :\s+\d+ creates  p50\s+[\d.]+ ms  p99\s+[\d.]+ ms$", r"^round 1 async:\s+\d+ creates",
        r"^sync / async: p50 [\d.]+x  p99 [\d.]+x$",
    ]),
    "fake_clips": (["--rounds", "2", "--durations", "5"], [r"^\s+5 s\s+[\d.]+\s+[\d.]+-[\d.]+\s+[\d.]+\s+[\d.]+$"]),
}


@pytest.mark.parametrize("script", sorted(SMALL_RUNS))
def test_the_benchmark_runs_and_reports(script: str, pg_admin_url: str):
    args, expected = SMALL_RUNS[script]
    # The database benchmarks make and drop a scratch database of their own on this server.
    env = {**os.environ, "VIDJOBS_DATABASE_URL": pg_admin_url}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for pattern in expected:
        assert re.search(pattern, done.stdout, re.MULTILINE), f"{pattern!r} not in:\n{done.stdout}"
