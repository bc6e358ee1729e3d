"""The `vidjobs` command: `up` runs the stack; `render`, `jobs`, `account`, `models` and `login` talk to the API
(cli/render.py), and so does `platform`, with a product's platform key (cli/platform_api.py); the rest are
operator commands on the database (cli/admin.py)."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial

from vidjobs.cli import admin, ops, platform_api, render, routing, spending
from vidjobs.cli.exitcodes import EPILOG, Exit, OperatorFailure
from vidjobs.common import migrate, routechanges
from vidjobs.common.errors import ConfigError, StoreError
from vidjobs.common.settings import Settings, load
from vidjobs.gateway import platformkeys
from vidjobs.gateway.accounts import LIMITS
from vidjobs.gateway.platformkeys import Scope


def _integer(minimum: int) -> Callable[[str], int]:
    def integer(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value
    return integer


def _positive() -> Callable[[str], float]:
    def number(text: str) -> float:
        value = float(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    return number


def _or_none(parse: Callable[[str], int | float]) -> Callable[[str], int | float | None]:
    def value_or_none(text: str) -> int | float | None:
        return None if text.lower() == "none" else parse(text)
    value_or_none.__name__ = parse.__name__  # argparse names the type in "invalid ... value"
    return value_or_none


# Account limits besides concurrency: option, `accounts` column, value parser, metavar, help.
_LIMIT_OPTIONS: tuple[tuple[str, str, Callable[[str], int | float], str, str], ...] = (
    ("--daily-cap", "daily_spend_cap", _integer(0), "N", "credits the account may commit per UTC day"),
    ("--max-job", "max_job_credits", _integer(1), "N", "the most credits one job may be estimated at"),
    ("--rate", "requests_per_s", _positive(), "R", "API requests per second per key, if not the platform's"),
    ("--burst", "request_burst", _integer(1), "N", "requests per key allowed at once after a quiet spell"),
    ("--storage-quota", "storage_quota_bytes", _integer(0), "BYTES",
     "what the account's kept clips may hold, if not the platform's"),
)


def _add_limits(parser: argparse.ArgumentParser, *, clearable: bool) -> None:
    for flag, column, parse, metavar, text in _LIMIT_OPTIONS:
        if clearable:
            parser.add_argument(flag, dest=column, type=_or_none(parse), default=argparse.SUPPRESS,
                                metavar=f"{metavar}|none", help=f"{text}; `none` for no limit")
        else:
            parser.add_argument(flag, dest=column, type=parse, metavar=metavar, help=f"{text} (default: none)")


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="JSON, one object a line, instead of a table")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidjobs", description="AI video render jobs, end to end.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"vidjobs {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _operator_jobs_parser(render.add_commands(sub, EPILOG))
    platform_api.add_commands(sub, EPILOG)
    up = sub.add_parser("up", help="run the whole stack in the foreground on embedded defaults")
    up.add_argument("--data-dir", help="where state is kept (VIDJOBS_DATA_DIR, default ./.vidjobs)")
    up.add_argument("--port", type=int, help="gateway port (VIDJOBS_HTTP_PORT, default 8080)")
    up.set_defaults(handler=_up)
    migrate = sub.add_parser("migrate", help="apply database migrations (the services also do this at start)")
    migrate.add_argument("--check", action="store_true",
                         help="apply nothing; exit 10 if the database lacks migrations, 11 if it has newer ones")
    migrate.set_defaults(handler=_migrate)
    roles = sub.add_parser("roles", help="give each service's database role exactly its grants, and show them")
    roles.add_argument("--sql", action="store_true",
                       help="print the statements for an administrator instead of running them")
    roles.set_defaults(handler=_roles)
    _accounts_parser(sub.add_parser("accounts", help="accounts and their limits"))
    _keys_parser(sub.add_parser("keys", help="an account's API keys"))
    _platform_keys_parser(sub.add_parser("platform-keys", help="the keys a product manages its users' accounts "
                                                              "with (platform keys), and what they did"))
    _credits_parser(sub.add_parser("credits", help="an account's credit and its ledger"))
    _submissions_parser(sub.add_parser("submissions", help="the platform-wide switch for new submissions"))
    _rates_parser(sub.add_parser("rates", help="the rate card jobs are priced by"))
    _dead_parser(sub.add_parser("dead", help="messages the services gave up on (dead letters, kept in NATS)"))
    _inbox_parser(sub.add_parser("inbox", help="provider callbacks stored by the gateway, and what providers told "
                                               "the poller"))
    _breakers_parser(sub.add_parser("breakers", help="providers' circuit breakers"))
    _routes_parser(sub.add_parser("routes", help="model aliases' routes: shares, rollbacks, their history, "
                                                 "how the routes compare"))
    _usage_parser(sub.add_parser("usage", help="what providers billed, what accounts were charged and what the "
                                               "platform absorbed, by provider, model or day"))
    return parser


def _operator_jobs_parser(actions: render.Subcommands) -> None:
    on_db = " (operator: acts on the database in VIDJOBS_DATABASE_URL, not through the API)"
    inspect = actions.add_parser("inspect", help="a job's row, trail, staged messages, timers, submissions, "
                                                 "assets and credit" + on_db)
    inspect.add_argument("job_id", metavar="JOB_ID")
    _json_flag(inspect)
    inspect.set_defaults(handler=_jobs_inspect)
    again = actions.add_parser("retry", help="give a stuck job another go: a new attempt for a render the "
                                             "provider sits on, its download or its queue message again" + on_db)
    again.add_argument("job_id", metavar="JOB_ID")
    again.set_defaults(handler=_jobs_retry)
    fail = actions.add_parser("fail", help="end a stuck job as failed; its credit reservation is released" + on_db)
    fail.add_argument("job_id", metavar="JOB_ID")
    fail.add_argument("--reason", default="", metavar="TEXT", help="the error message its owner sees")
    fail.set_defaults(handler=_jobs_fail)


def _dead_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every dead letter: subject, event, job, error, when")
    _json_flag(listing)
    listing.set_defaults(handler=_dead_list)
    show = actions.add_parser("show", help="one dead letter, with its message, as JSON")
    show.add_argument("letter_id", type=int, metavar="ID")
    show.set_defaults(handler=_dead_show)
    replay = actions.add_parser("replay", help="send a dead letter's message to its work subject again and "
                                               "remove the dead letter; prints the ids replayed")
    replay.add_argument("letter_id", type=int, nargs="?", metavar="ID")
    replay.add_argument("--all", action="store_true", help="every dead letter kept")
    replay.set_defaults(handler=_dead_replay)


def _inbox_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    replay = actions.add_parser("replay", help="hand a stored callback to the poller again, as on its arrival")
    replay.add_argument("inbox_id", type=int, metavar="ID")
    replay.set_defaults(handler=_inbox_replay)
    show = actions.add_parser("show", help="what a job's provider told us about it, oldest first: status polls' "
                                           "answers (a run of the same answer in one row) and its callbacks")
    show.add_argument("job_id", metavar="JOB_ID")
    _json_flag(show)
    show.set_defaults(handler=_inbox_show)
    unmatched = actions.add_parser("unmatched", help="stored callbacks about no job of ours (an unknown render), "
                                                     "newest first")
    unmatched.add_argument("--provider", metavar="PROVIDER", help="only this provider's")
    unmatched.add_argument("--limit", type=_integer(1), default=50, help="callbacks to show (default 50)")
    _json_flag(unmatched)
    unmatched.set_defaults(handler=_inbox_unmatched)


def _breakers_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="each provider's breaker: state, failures, when it reopens, what "
                                              "opened it")
    _json_flag(listing)
    listing.set_defaults(handler=_breakers_list)
    reset = actions.add_parser("reset", help="close a provider's breaker now; submissions to it resume")
    reset.add_argument("provider", metavar="PROVIDER")
    reset.set_defaults(handler=_breakers_reset)


def _routes_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every alias's routes: share, enabled, its part of the accounts")
    _json_flag(listing)
    listing.set_defaults(handler=_routes_list)
    change = actions.add_parser("set", help="make these the alias's routes and shares (routes left out are "
                                            "removed); prints the change's id")
    change.add_argument("alias", metavar="ALIAS")
    change.add_argument("shares", nargs="+", metavar="ROUTE=SHARE",
                        help="a real model and its whole-number share, e.g. fake/default=95 luma/ray-2=5")
    _reason(change)
    change.set_defaults(handler=_routes_set)
    for name, enabled, text in (("disable", False, "take a route out of every alias that has it (a rollback); "
                                                   "its share goes to the others"),
                                ("enable", True, "put a disabled route back, with its share")):
        flip = actions.add_parser(name, help=text)
        flip.add_argument("model", metavar="ROUTE")
        flip.add_argument("--alias", metavar="ALIAS", help="only in this alias")
        _reason(flip)
        flip.set_defaults(handler=partial(_routes_enabled, enabled=enabled))
    past = actions.add_parser("history", help="every change of the routes, newest first: who, when, before, after")
    past.add_argument("--alias", metavar="ALIAS", help="only this alias's changes")
    past.add_argument("--limit", type=_integer(1), default=50, help="changes to show (default 50)")
    _json_flag(past)
    past.set_defaults(handler=_routes_history)
    side = actions.add_parser("compare", help="an alias's routes side by side: jobs, durations, failures, "
                                              "regenerations, cost")
    side.add_argument("alias", metavar="ALIAS")
    side.add_argument("--since", default="7d", metavar="T",
                      help="jobs created since: a span back from now (30m, 24h, 7d) or an ISO 8601 time "
                           "(default 7d)")
    _json_flag(side)
    side.set_defaults(handler=_routes_compare)


def _reason(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", default="", metavar="TEXT", help="why, for the history")


def _accounts_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create an account and print its API key")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--credits", type=_integer(0), default=10_000, metavar="N",
                        help="opening credit (default 10000)")
    create.add_argument("--concurrency", type=_integer(1), default=2, metavar="N",
                        help="jobs rendering at once (default 2)")
    _add_limits(create, clearable=False)
    create.set_defaults(handler=_accounts_create)
    listing = actions.add_parser("list", help="every account with its credit, limits, keys and active jobs")
    _json_flag(listing)
    listing.set_defaults(handler=_accounts_list)
    change = actions.add_parser("set", help="change an account's limits")
    change.add_argument("account_id", metavar="ACCOUNT_ID")
    change.add_argument("--concurrency", dest="concurrent_jobs", type=_integer(1), default=argparse.SUPPRESS,
                        metavar="N", help="jobs rendering at once")
    _add_limits(change, clearable=True)
    change.set_defaults(handler=_accounts_set)
    delete = actions.add_parser(
        "delete", help="revoke an account's keys and cancel its live jobs; --purge also removes its objects and "
                       "rows (a data-deletion request); prints what it canceled or removed")
    delete.add_argument("account_id", metavar="ACCOUNT_ID")
    delete.add_argument("--purge", action="store_true",
                        help="also remove every object and row of the account, the account itself last")
    delete.add_argument("--wait", dest="wait_s", type=_positive(), default=30.0, metavar="SECONDS",
                        help="with --purge: how long to wait for canceled jobs and copies in progress to end "
                             "(default 30); refused, with nothing removed, if they have not")
    _json_flag(delete)
    delete.set_defaults(handler=_accounts_delete)


def _keys_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a new API key for an account; printed once, stored hashed")
    create.add_argument("account_id", metavar="ACCOUNT_ID")
    create.add_argument("--name", default="", help="what the key is for")
    create.set_defaults(handler=_keys_create)
    listing = actions.add_parser("list", help="an account's keys (never the keys themselves)")
    listing.add_argument("account_id", metavar="ACCOUNT_ID")
    _json_flag(listing)
    listing.set_defaults(handler=_keys_list)
    revoke = actions.add_parser("revoke", help="refuse a key from now on")
    revoke.add_argument("key_id", metavar="KEY_ID")
    revoke.set_defaults(handler=_keys_revoke)


_SPAN = re.compile(r"(\d{1,6})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _span(*, zero: bool) -> Callable[[str], timedelta]:
    def span(text: str) -> timedelta:
        found = _SPAN.fullmatch(text.strip())
        if found is None or (not zero and int(found[1]) == 0):
            raise argparse.ArgumentTypeError(f"a span such as 90m, 24h or 30d{'' if zero else ' (above 0)'}, "
                                             f"not {text!r}")
        return timedelta(seconds=int(found[1]) * _UNIT_S[found[2]])
    return span


def _platform_keys_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a new key for a product (made on first use); printed once, "
                                               "stored hashed")
    create.add_argument("--platform", required=True, metavar="NAME", help="the product the key is for")
    create.add_argument("--scopes", required=True, metavar="SCOPE,...",
                        help=f"what the key may do, comma-separated: {', '.join(Scope)}")
    create.add_argument("--name", default="", help="what the key is for (its holder, say)")
    create.add_argument("--expires-in", type=_span(zero=False), metavar="SPAN",
                        help="refused after this long: 90m, 24h, 30d (default: never)")
    create.set_defaults(handler=_platform_keys_create)
    listing = actions.add_parser("list", help="platform keys (never the keys themselves), oldest first")
    listing.add_argument("--platform", metavar="NAME", help="only this product's")
    _json_flag(listing)
    listing.set_defaults(handler=_platform_keys_list)
    revoke = actions.add_parser("revoke", help="refuse a key from now on (and the browser tokens it issued)")
    revoke.add_argument("key_id", metavar="KEY_ID")
    revoke.set_defaults(handler=_platform_keys_revoke)
    rotate = actions.add_parser("rotate", help="a new key with the same product, name and scopes, printed once; "
                                               "the old one works for the overlap more")
    rotate.add_argument("key_id", metavar="KEY_ID")
    rotate.add_argument("--overlap", type=_span(zero=True), default=timedelta(hours=24), metavar="SPAN",
                        help="how long the old key still works: 0s, 90m, 24h, 7d (default 24h)")
    rotate.set_defaults(handler=_platform_keys_rotate)
    trail = actions.add_parser("audit", help="what platform keys changed through the API, newest first")
    trail.add_argument("--platform", metavar="NAME", help="only this product's keys")
    trail.add_argument("--account", metavar="ACCOUNT_ID", help="only what was done to or for this account")
    trail.add_argument("--limit", type=_integer(1), default=50, help="lines to show (default 50)")
    _json_flag(trail)
    trail.set_defaults(handler=_platform_keys_audit)


def _credits_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    give = actions.add_parser("grant", help="add credit (negative: take free credit back); prints the balance")
    give.add_argument("account_id", metavar="ACCOUNT_ID")
    give.add_argument("amount", type=int, metavar="N")
    give.add_argument("--note", default="", metavar="TEXT", help="why, for the ledger")
    give.set_defaults(handler=_credits_grant)
    ledger = actions.add_parser("ledger", help="the account's newest ledger entries")
    ledger.add_argument("account_id", metavar="ACCOUNT_ID")
    ledger.add_argument("--limit", type=_integer(1), default=20, help="entries to show (default 20)")
    _json_flag(ledger)
    ledger.set_defaults(handler=_credits_ledger)


def _moment(text: str) -> datetime:
    """An ISO-8601 date (midnight UTC) or time; one without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 date or time: {text!r}") from exc
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _usage_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="start", type=_moment, metavar="WHEN",
                        help="jobs created at or after this ISO-8601 date or time, UTC unless it says (default: "
                             "30 days before --to)")
    parser.add_argument("--to", dest="end", type=_moment, metavar="WHEN",
                        help="jobs created before this (default: now)")
    parser.add_argument("--group-by", choices=[g.value for g in spending.GroupBy], default="provider",
                        help="one row per provider (default), model or UTC day")
    _json_flag(parser)
    parser.set_defaults(handler=_usage)


def _submissions_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    pause = actions.add_parser("pause", help="send nothing new to any provider; running jobs go on")
    pause.add_argument("--reason", default="", metavar="TEXT", help="shown with every waiting job")
    pause.set_defaults(handler=partial(_submissions_set, paused=True))
    resume = actions.add_parser("resume", help="send waiting jobs to providers again")
    resume.set_defaults(handler=partial(_submissions_set, paused=False), reason="")
    status = actions.add_parser("status", help="whether submissions are paused, and why")
    _json_flag(status)
    status.set_defaults(handler=_submissions_status)


def _rates_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="the current rate card")
    _json_flag(show)
    show.set_defaults(handler=_rates_show)
    publish = actions.add_parser("set", help="publish a JSON rate card as the next version; prints its number")
    publish.add_argument("file", metavar="FILE",
                         help='JSON: {"credits_per_usd": 100, "prices": [{"model": "*", "resolution": "720p", '
                              '"credits_per_second": 10}, ...], "note": "..."}')
    publish.set_defaults(handler=_rates_set)


@contextlib.contextmanager
def embedded_database(settings: Settings) -> Iterator[Settings]:
    """Settings with a database: VIDJOBS_DATABASE_URL, or the embedded server under the data directory
    (shared with a running `vidjobs up`, started for the moment if none is running)."""
    if settings.database_url:
        yield settings
        return
    from vidjobs.cli.embedded import EmbeddedPostgres

    pgdata = settings.data_path / "postgres"
    if not (pgdata / "PG_VERSION").exists():
        raise ConfigError(f"no database under {settings.data_path}: run `vidjobs up` first or set VIDJOBS_DATABASE_URL")
    server = EmbeddedPostgres(pgdata).start()
    try:
        yield settings.with_(database_url=server.url)
    finally:
        server.stop()


def _admin(settings: Settings, command: admin.Command) -> int:
    with embedded_database(settings) as resolved:
        admin.run(resolved.database_url, command)
    return 0


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from vidjobs.cli.up import up

    changes = {}
    if args.data_dir:
        changes["data_dir"] = args.data_dir
    if args.port:
        changes["http_port"] = args.port
    return up(settings.with_(**changes))


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    with embedded_database(settings) as resolved:
        return migrate.run(resolved.database_url, check=args.check)


def _roles(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.service_roles, sql_only=args.sql))


def _accounts_create(args: argparse.Namespace, settings: Settings) -> int:
    limits = {column: getattr(args, column) for _, column, *_ in _LIMIT_OPTIONS}
    return _admin(settings, partial(admin.create_account, name=args.name, credits=args.credits,
                                    concurrency=args.concurrency, limits=limits))


def _accounts_list(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.list_accounts, as_json=args.json))


def _accounts_set(args: argparse.Namespace, settings: Settings) -> int:
    changes = {name: value for name, value in vars(args).items() if name in LIMITS}
    if not changes:
        raise ConfigError("nothing to change: give --concurrency, --daily-cap, --max-job, --rate or --burst")
    return _admin(settings, partial(admin.set_limits, account_id=args.account_id, changes=changes))


def _accounts_delete(args: argparse.Namespace, settings: Settings) -> int:
    with embedded_database(settings) as resolved:
        admin.run(resolved.database_url, partial(
            admin.delete_account, account_id=args.account_id, purge=args.purge, wait_s=args.wait_s,
            settings=resolved, as_json=args.json))
    return 0


def _keys_create(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.create_key, account_id=args.account_id, name=args.name))


def _keys_list(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.list_keys, account_id=args.account_id, as_json=args.json))


def _keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.revoke_key, key_id=args.key_id))


def _platform_name(text: str) -> str:
    name = text.strip()
    if not name or len(name) > 100 or not name.isprintable():
        raise ConfigError(f"--platform {text!r}: name the product in 1-100 printable characters")
    return name


def _platform_keys_create(args: argparse.Namespace, settings: Settings) -> int:
    try:
        scopes = platformkeys.parse_scopes(args.scopes)
    except ValueError as exc:
        raise ConfigError(f"--scopes {args.scopes!r}: {exc}") from exc
    return _admin(settings, partial(admin.create_platform_key, platform=_platform_name(args.platform),
                                    scopes=scopes, name=args.name, expires_in=args.expires_in))


def _platform_keys_list(args: argparse.Namespace, settings: Settings) -> int:
    platform = None if args.platform is None else _platform_name(args.platform)
    return _admin(settings, partial(admin.list_platform_keys, platform=platform, as_json=args.json))


def _platform_keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.revoke_platform_key, key_id=args.key_id))


def _platform_keys_rotate(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.rotate_platform_key, key_id=args.key_id, overlap=args.overlap))


def _platform_keys_audit(args: argparse.Namespace, settings: Settings) -> int:
    platform = None if args.platform is None else _platform_name(args.platform)
    return _admin(settings, partial(admin.platform_audit, platform=platform, account_id=args.account,
                                    limit=args.limit, as_json=args.json))


def _credits_grant(args: argparse.Namespace, settings: Settings) -> int:
    if args.amount == 0:
        raise ConfigError("grant a non-zero amount: positive adds credit, negative takes free credit back")
    return _admin(settings, partial(admin.grant, account_id=args.account_id, amount=args.amount, note=args.note))


def _credits_ledger(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.ledger, account_id=args.account_id, limit=args.limit, as_json=args.json))


def _usage(args: argparse.Namespace, settings: Settings) -> int:
    end = args.end or datetime.now(UTC)
    start = args.start or end - timedelta(days=30)
    if start >= end:
        raise ConfigError(f"--from ({start.isoformat()}) must be before --to ({end.isoformat()})")
    return _admin(settings, partial(admin.usage, group_by=spending.GroupBy(args.group_by), start=start, end=end,
                                    as_json=args.json))


def _submissions_set(args: argparse.Namespace, settings: Settings, *, paused: bool) -> int:
    return _admin(settings, partial(admin.set_submissions, paused=paused, reason=args.reason))


def _submissions_status(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.submissions_status, as_json=args.json))


def _rates_show(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(admin.show_rates, as_json=args.json))


def _rates_set(args: argparse.Namespace, settings: Settings) -> int:
    card = admin.read_rate_card(args.file)  # a bad file is refused before the database is touched
    return _admin(settings, partial(admin.set_rates, card=card))


def _dead_list(args: argparse.Namespace, settings: Settings) -> int:
    ops.run_bus(settings.nats_url, partial(ops.dead_list, as_json=args.json))
    return 0


def _dead_show(args: argparse.Namespace, settings: Settings) -> int:
    ops.run_bus(settings.nats_url, partial(ops.dead_show, letter_id=args.letter_id))
    return 0


def _dead_replay(args: argparse.Namespace, settings: Settings) -> int:
    if args.all == (args.letter_id is not None):
        raise ConfigError("name one dead letter (ID) or give --all")
    ops.run_bus(settings.nats_url, partial(ops.dead_replay, letter_id=args.letter_id))
    return 0


def _inbox_replay(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.inbox_replay, inbox_id=args.inbox_id))


def _inbox_show(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.inbox_show, job_id=args.job_id, as_json=args.json))


def _inbox_unmatched(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.inbox_unmatched, provider=args.provider, limit=args.limit,
                                    as_json=args.json))


def _jobs_inspect(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.job_inspect, job_id=args.job_id, as_json=args.json))


def _jobs_retry(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.job_retry, job_id=args.job_id, recovery_delay_s=settings.recovery_delay_s))


def _jobs_fail(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.job_fail, job_id=args.job_id, reason=args.reason))


def _breakers_list(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.breakers_list, as_json=args.json))


def _breakers_reset(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(ops.breakers_reset, provider=args.provider))


def _routes_list(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(routing.list_routes, as_json=args.json))


def _routes_set(args: argparse.Namespace, settings: Settings) -> int:
    shares = routing.parse_shares(args.shares)  # a malformed argument is refused before the database is touched
    known = routing.known_models()
    routechanges.check_set(args.alias, shares, known)
    return _admin(settings, partial(routing.set_routes, alias=args.alias, shares=shares, known=known,
                                    reason=args.reason))


def _routes_enabled(args: argparse.Namespace, settings: Settings, *, enabled: bool) -> int:
    return _admin(settings, partial(routing.set_enabled, model=args.model, enabled=enabled, alias=args.alias,
                                    reason=args.reason))


def _routes_history(args: argparse.Namespace, settings: Settings) -> int:
    return _admin(settings, partial(routing.history, alias=args.alias, limit=args.limit, as_json=args.json))


def _routes_compare(args: argparse.Namespace, settings: Settings) -> int:
    since = routing.parse_since(args.since)
    return _admin(settings, partial(routing.compare_routes, alias=args.alias, since=since,
                                    window_s=settings.regeneration_window_s, as_json=args.json))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vidjobs-cli")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler: Callable[..., int] = args.handler  # every command's parser sets its own
    try:
        if not getattr(args, "needs_settings", True):
            return handler(args)  # the commands that talk to the API need none of the services' settings
        return handler(args, load())
    except OperatorFailure as exc:
        print(f"vidjobs: {exc}", file=sys.stderr)
        return exc.exit
    except StoreError as exc:  # the database refused the change (a withdrawal beyond the free credit, say)
        print(f"vidjobs: {exc}", file=sys.stderr)
        return Exit.REFUSED
    except ConfigError as exc:
        print(f"vidjobs: {exc}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
