"""The `vidjobs` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Iterator

import asyncpg

from libs.common import db
from libs.common.errors import ConfigError
from libs.common.settings import Settings, load


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidjobs", description="AI video render jobs, end to end.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the whole stack in the foreground on embedded defaults")
    up.add_argument("--data-dir", help="where state is kept (VIDJOBS_DATA_DIR, default ./.vidjobs)")
    up.add_argument("--port", type=int, help="gateway port (VIDJOBS_HTTP_PORT, default 8080)")
    sub.add_parser("migrate", help="apply database migrations (the services also do this at start)")
    accounts = sub.add_parser("accounts", help="manage accounts").add_subparsers(dest="action", required=True)
    create = accounts.add_parser("create", help="create an account and print its API key")
    create.add_argument("name")
    create.add_argument("--credits", type=int, default=10_000)
    create.add_argument("--concurrency", type=int, default=2)
    return parser


async def _create_account(settings: Settings, name: str, credits: int, concurrency: int) -> str:
    from services.gateway.accounts import create_account

    url = settings.database_url
    await db.migrate(url)
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            _, key = await create_account(conn, name, credits=credits, concurrency=concurrency)
    finally:
        await conn.close()
    return key


@contextlib.contextmanager
def embedded_database(settings: Settings) -> Iterator[Settings]:
    """Settings with a database: VIDJOBS_DATABASE_URL, or the embedded server under the data directory
    (shared with a running `vidjobs up`, started for the moment if none is running)."""
    if settings.database_url:
        yield settings
        return
    from cli.embedded import EmbeddedPostgres

    pgdata = settings.data_path / "postgres"
    if not (pgdata / "PG_VERSION").exists():
        raise ConfigError(f"no database under {settings.data_path}: run `vidjobs up` first or set VIDJOBS_DATABASE_URL")
    server = EmbeddedPostgres(pgdata).start()
    try:
        yield settings.with_(database_url=server.url)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load()
        if args.command == "up":
            from cli.up import up

            changes = {}
            if args.data_dir:
                changes["data_dir"] = args.data_dir
            if args.port:
                changes["http_port"] = args.port
            return up(settings.with_(**changes))
        if args.command == "migrate":
            with embedded_database(settings) as resolved:
                applied = asyncio.run(db.migrate(resolved.database_url))
            print(f"schema up to date; applied {len(applied)} migration(s): {', '.join(applied) or 'none'}",
                  file=sys.stderr)
            return 0
        if args.command == "accounts" and args.action == "create":
            if args.credits < 0 or args.concurrency < 1:
                raise ConfigError("--credits must be >= 0 and --concurrency >= 1")
            with embedded_database(settings) as resolved:
                print(asyncio.run(_create_account(resolved, args.name, args.credits, args.concurrency)))
            return 0
    except ConfigError as exc:
        print(f"vidjobs: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
