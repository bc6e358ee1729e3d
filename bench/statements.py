"""Statements per job, counted from PostgreSQL's own log: pgserver's build has no pg_stat_statements, so the
benchmark turns on `log_statement = 'all'` for the run, reads the log it wrote, and groups the statements
by their text with literals and whitespace folded.

Each line names its database too, so a count can keep to one database of a server others use as well (the
test suite's: every test database's statements are logged while the logging is on).

Logging every statement costs the server CPU, so a run that counts statements is not a run to time.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import asyncpg

_LINE = re.compile(r"(?:<([^>]*)> )?(?:\{([^}]*)\} )?LOG:\s+(?:statement|execute [^:]*): (.*)")
_SPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"\b\d+\b")


async def start_logging(database_url: str) -> None:
    # The session's application_name (the service: vidjobs-media, ...) and its database go in front of each line.
    await _set(database_url, log_statement="'all'", log_line_prefix="'%m [%p] <%a> {%d} '")


async def stop_logging(database_url: str) -> None:
    await _set(database_url, log_statement="'none'", log_line_prefix="'%m [%p] '")


async def _set(database_url: str, **values: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        for name, value in values.items():
            await conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


def shape(sql: str) -> str:
    return _NUMBER.sub("N", _SPACE.sub(" ", sql).strip())[:110]


def count(log_path: Path, offset: int, database: str | None = None) -> Counter[str]:
    """Statements logged after byte `offset` (in `database` only, where given); a statement's continuation
    lines are folded into it."""
    counts: Counter[str] = Counter()
    current: list[str] | None = None
    with log_path.open(errors="replace") as f:
        f.seek(offset)
        for line in f:
            match = _LINE.search(line)
            if match and database is not None and match.group(2) != database:
                if current is not None:
                    counts[shape(" ".join(current))] += 1
                current = None  # another database's statement, its continuation lines with it
                continue
            if match:
                if current is not None:
                    counts[shape(" ".join(current))] += 1
                current = [f"[{(match.group(1) or '?').strip('[]').removeprefix('vidjobs-')}]", match.group(3)]
            elif current is not None and line.startswith("\t"):
                current.append(line)
            elif current is not None:
                counts[shape(" ".join(current))] += 1
                current = None
    if current is not None:
        counts[shape(" ".join(current))] += 1
    return counts


def report(counts: Counter[str], jobs: int, top: int = 40) -> None:
    total = sum(counts.values())
    by_service: Counter[str] = Counter()
    for sql, n in counts.items():
        by_service[sql.split("]", 1)[0].lstrip("[")] += n
    print(f"statements per job: {total / jobs:.1f} ({total} for {jobs} jobs): "
          + ", ".join(f"{name} {n / jobs:.1f}" for name, n in by_service.most_common()))
    print("the most frequent:")
    for sql, n in counts.most_common(top):
        print(f"  {n / jobs:6.2f}  {sql}")
