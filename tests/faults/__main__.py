"""`python -m tests.faults [--long] [--backlog N] [SCENARIO ...]`: run fault scenarios against the whole stack
and print one table row per scenario. `python -m tests.faults nemesis [--seed S] [--minutes M]`: the nemesis
run (tests/faults/nemesis): random overlapping faults under a mixed load, and the whole history checked.

A name also selects every scenario it is a prefix of
(`object_store_outage` runs both backends). `--backlog N` parks N jobs beside each scenario's workload (see
tests/faults/backlog.py; default VIDJOBS_FAULTS_BACKLOG, else 200; 0 for none). Exit status 1 when any row
failed."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import traceback

from tests.faults import backlog
from tests.faults.report import Row, table
from tests.faults.scenarios import SCENARIOS


def selected(names: list[str]) -> list[str]:
    if not names:
        return list(SCENARIOS)
    chosen = [s for s in SCENARIOS if any(s == n or s.startswith(n) for n in names)]
    unknown = [n for n in names if not any(s.startswith(n) for s in SCENARIOS)]
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    return chosen


async def run_one(name: str, long: bool) -> Row | None:
    scenario = SCENARIOS[name]
    if scenario is None:
        print(f"{name}: not written yet", flush=True)
        return None
    print(f"{name} ({'long' if long else 'short'}) ...", flush=True)
    try:
        return await scenario(long)
    except Exception as exc:  # one scenario's crash is reported in its row; the others still run
        traceback.print_exc()
        row = Row(name)
        row.broken.append(f"the scenario itself crashed: {exc!r}")
        return row


async def run_all(names: list[str], long: bool) -> list[Row]:
    rows = []
    for name in names:
        row = await run_one(name, long)
        if row is not None:
            rows.append(row)
            print(table([row]), flush=True)
    return rows


def backlog_size(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give the number of backlog jobs as a whole number (0 for none)")
    return int(text)


def nemesis_main(argv: list[str]) -> int:
    from tests.faults.nemesis.run import nemesis, report

    parser = argparse.ArgumentParser(prog="python -m tests.faults nemesis",
                                     description="random overlapping faults under a mixed load; prints the seed")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's schedule (default: a random seed)")
    parser.add_argument("--minutes", type=float, default=2.0, help="minutes of load under faults (default 2)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    print(f"nemesis seed {seed} (replay: python -m tests.faults nemesis --seed {seed} --minutes {args.minutes:g})",
          flush=True)
    outcome = asyncio.run(nemesis(seed, args.minutes))
    print("\n" + report(outcome), flush=True)
    return 0 if outcome.passed else 1


def main() -> int:
    if sys.argv[1:2] == ["nemesis"]:
        return nemesis_main(sys.argv[2:])
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--long", action="store_true", help="the long versions (minutes each)")
    parser.add_argument("--backlog", type=backlog_size, metavar="N",
                        help=f"jobs parked beside each workload on a full quota (default {backlog.DEFAULT_SIZE})")
    parser.add_argument("scenarios", nargs="*", help=f"any of: {', '.join(SCENARIOS)}")
    args = parser.parse_args()
    if args.backlog is not None:
        os.environ[backlog.ENV] = str(args.backlog)  # where every scenario's fault_run reads it
    rows = asyncio.run(run_all(selected(args.scenarios), args.long))
    print("\n" + table(rows), flush=True)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
