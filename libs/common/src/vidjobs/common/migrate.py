"""Bring a database's schema to what this code needs, as the schema's owner: the numbered migrations, then each
service role's grants (db.migrate). `python -m vidjobs.common.migrate [--check]` runs it from any service's
image, none of which holds the `vidjobs` command: the migrations Job and every pod's wait-for-schema run it.
`vidjobs migrate` runs the same `run`.

Exit statuses are the `vidjobs` command's (cli/exitcodes.py), so a script reads both alike."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from enum import IntEnum

import asyncpg

from vidjobs.common import db
from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import load


class Status(IntEnum):
    CURRENT = 0
    USAGE = 2  # also argparse's: an image whose module lacks --check stops a wait at once
    UNREACHABLE = 9
    BEHIND = 10  # the database lacks migrations this code needs
    AHEAD = 11  # the database was migrated by newer code


def run(database_url: str, *, check: bool) -> Status:
    """With `check`, change nothing and say whether the schema is current; else apply what is missing (and the
    grants). Notes go to stderr."""
    if check:
        return asyncio.run(_check(database_url))
    applied = asyncio.run(db.migrate(database_url))
    _note(f"schema up to date; applied {len(applied)} migration(s): {', '.join(applied) or 'none'}")
    return Status.CURRENT


async def _check(database_url: str) -> Status:
    try:
        conn = await asyncpg.connect(database_url, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        _note(f"cannot reach the database ({exc}); check VIDJOBS_DATABASE_URL")
        return Status.UNREACHABLE
    try:
        schema = await db.schema(conn)
    finally:
        await conn.close()
    if schema.unknown:
        _note(f"the database has migration(s) {_numbers(schema.unknown)} that this version does not know: this "
              "checkout is older than the database; use the version that migrated it")
        return Status.AHEAD
    if schema.missing:
        _note(f"the database lacks migration(s) {_numbers(schema.missing)} that this version needs: run "
              "`vidjobs migrate` or `python -m vidjobs.common.migrate` (the services also migrate when they start)")
        return Status.BEHIND
    _note(f"schema up to date: {len(schema.applied)} migrations, the last {max(schema.applied):04d}")
    return Status.CURRENT


def _numbers(versions: Sequence[int]) -> str:
    return ", ".join(f"{v:04d}" for v in versions)


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vidjobs.common.migrate",
                                     description="Apply the schema's migrations and the service roles' grants.")
    parser.add_argument("--check", action="store_true",
                        help="apply nothing; exit 10 if the database lacks migrations, 11 if it has newer ones")
    args = parser.parse_args(argv)
    try:
        settings = load()
    except ConfigError as exc:
        _note(str(exc))
        return Status.USAGE
    if not settings.database_url:
        _note("VIDJOBS_DATABASE_URL is not set: name the database to migrate, as its schema's owner")
        return Status.USAGE
    return run(settings.database_url, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
