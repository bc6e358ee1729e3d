"""`vidjobs platform ...`: what a product's engineers do by hand with their platform key, through the API and the
Python client's `Platform`: make and find their users' accounts, set plans and limits, grant and take back
credit, issue keys and browser tokens, and read the audit trail.

The key comes from `VIDJOBS_PLATFORM_KEY` (the operator makes one with `vidjobs platform-keys create`); the API
is found as the other API commands find it (--url, VIDJOBS_URL, `vidjobs login`'s). What a command exists to give
(an account id, a key, a token, a balance, tab-separated rows) goes to stdout; `--json` prints each object as a
JSON line instead; notes go to stderr.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from vidjobs.cli import profile, show
from vidjobs.cli.exitcodes import Exit
from vidjobs.cli.render import Handler, Subcommands, reporting, said_retry
from vidjobs.common.errors import ConfigError
from vidjobs_client import Platform, RetryPolicy
from vidjobs_client.models import Plan, PlatformAccount

KEY_VARIABLE = "VIDJOBS_PLATFORM_KEY"

# Limits an account may be given: option, the API's field, value parser, help.
_LIMITS: tuple[tuple[str, str, Callable[[str], int | float], str], ...] = (
    ("--concurrency", "concurrent_jobs", int, "jobs rendering at once"),
    ("--max-queued", "max_queued_jobs", int, "jobs waiting for a slot"),
    ("--daily-cap", "daily_spend_cap", int, "credits the account may commit per UTC day"),
    ("--max-job", "max_job_credits", int, "the most credits one job may be estimated at"),
    ("--rate", "requests_per_s", float, "API requests per second per key"),
    ("--burst", "request_burst", int, "requests per key at once after a quiet spell"),
    ("--storage-quota", "storage_quota_bytes", int, "bytes its kept clips may hold"),
)
_PLAN_LIMITS = ("concurrent_jobs", "max_queued_jobs", "daily_spend_cap", "max_job_credits")


def _platform(args: argparse.Namespace) -> Platform:
    key = os.environ.get(KEY_VARIABLE)
    if not key:
        raise ConfigError(f"no platform key: set {KEY_VARIABLE} to the vjp_ key your operator made "
                          "(`vidjobs platform-keys create --platform NAME --scopes ...`)")
    return Platform(args.url or profile.resolve_url(), key, retry=RetryPolicy(on_retry=said_retry))


def _clearable(parse: Callable[[str], int | float]) -> Callable[[str], int | float | None]:
    def value_or_none(text: str) -> int | float | None:
        return None if text.lower() == "none" else parse(text)
    value_or_none.__name__ = parse.__name__  # argparse names the type in "invalid ... value"
    return value_or_none


def _add_limits(parser: argparse.ArgumentParser, *, changing: bool, only: tuple[str, ...] | None = None) -> None:
    for flag, field, parse, text in _LIMITS:
        if only is not None and field not in only:
            continue
        if changing and field != "concurrent_jobs":
            parser.add_argument(flag, dest=field, type=_clearable(parse), default=argparse.SUPPRESS,
                                metavar="N|none", help=f"{text}; `none` clears it (the default applies)")
        else:
            parser.add_argument(flag, dest=field, type=parse, default=argparse.SUPPRESS, metavar="N", help=text)


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    return {field: getattr(args, field) for _, field, *_ in _LIMITS if hasattr(args, field)}


def add_commands(sub: Subcommands, epilog: str) -> None:
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--url", help="the API (VIDJOBS_URL, else `vidjobs login`'s, else " + profile.DEFAULT_URL + ")")
    flags.add_argument("--json", action="store_true", help="JSON on stdout (one object a line), nothing else")
    group = sub.add_parser("platform", help="your users' accounts, their credit, keys, tokens and plans, with your "
                                            "platform key (VIDJOBS_PLATFORM_KEY)", epilog=epilog)
    groups = group.add_subparsers(dest="group", required=True)

    def command(parent: Subcommands, name: str, handler: Handler, text: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=[flags], help=text, description=text, epilog=epilog)
        parser.set_defaults(handler=reporting(handler), needs_settings=False)
        return parser

    def account_command(parent: Subcommands, name: str, handler: Handler, text: str) -> argparse.ArgumentParser:
        parser = command(parent, name, handler, text)
        parser.add_argument("account_id", metavar="ACCOUNT_ID")
        return parser

    command(groups, "whoami", _whoami, "the platform key's product and scopes")

    accounts = groups.add_parser("accounts", help="your users' accounts").add_subparsers(dest="action", required=True)
    create = command(accounts, "create", _accounts_create, "the account of one of your users: made now, or the one "
                                                           "made for this external id before; prints its id")
    create.add_argument("--external-id", required=True, metavar="ID", help="your own id of the user")
    create.add_argument("--name", default="", help="its name (default: the external id)")
    create.add_argument("--plan", help="a plan's limits (`vidjobs platform plans set` makes one)")
    _add_limits(create, changing=False)
    listing = command(accounts, "list", _accounts_list, "your accounts, oldest first: id, external id, name, plan, "
                                                        "status, credit available")
    listing.add_argument("--external-id", metavar="ID", help="only this user's")
    listing.add_argument("-L", "--limit", type=int, default=100, help="show at most this many (default 100)")
    account_command(accounts, "show", _accounts_show, "one account: plan, status, credit, limits")
    change = account_command(accounts, "set", _accounts_set, "change an account's name, plan or limits")
    change.add_argument("--name", default=argparse.SUPPRESS)
    change.add_argument("--plan", default=argparse.SUPPRESS, help="put it on this plan (its limits, at once)")
    _add_limits(change, changing=True)
    disable = account_command(accounts, "disable", _accounts_disable, "stop an account creating jobs; its waiting "
                                                                      "jobs are canceled (prints their ids)")
    disable.add_argument("--stop-running", action="store_true", help="cancel its running jobs too")
    disable.add_argument("--reason", default="", metavar="TEXT", help="why, for its canceled jobs")
    account_command(accounts, "enable", _accounts_enable, "let a disabled account create jobs again")
    account_command(accounts, "delete", _accounts_delete, "close an account (keys revoked, live jobs canceled: "
                                                          "prints their ids); its data is then removed")

    credits = groups.add_parser("credits", help="an account's credit").add_subparsers(dest="action", required=True)
    for name, handler, text in (("grant", _credits_grant, "add credit, once per idempotency key; prints the "
                                                          "balance"),
                                ("take-back", _credits_take_back, "take credit back (a refund), once per "
                                                                  "idempotency key; prints the balance")):
        change_credit = account_command(credits, name, handler, text)
        change_credit.add_argument("amount", type=int, metavar="N")
        change_credit.add_argument("--idempotency-key", required=True, metavar="KEY",
                                   help="your billing provider's event id: the same key is one change")
        change_credit.add_argument("--reason", default="", metavar="TEXT", help="why, for the ledger")
    ledger = account_command(credits, "ledger", _credits_ledger, "the account's newest ledger entries")
    ledger.add_argument("-L", "--limit", type=int, default=20, help="show at most this many (default 20)")

    keys = groups.add_parser("keys", help="an account's API keys").add_subparsers(dest="action", required=True)
    key = account_command(keys, "create", _keys_create, "a new API key for an account; printed once")
    key.add_argument("--name", default="", help="what the key is for")
    account_command(keys, "list", _keys_list, "an account's API keys (never the keys)")
    account_command(keys, "revoke", _keys_revoke, "revoke one of an account's keys").add_argument(
        "key_id", metavar="KEY_ID")

    tokens = groups.add_parser("tokens", help="browser tokens").add_subparsers(dest="action", required=True)
    token = account_command(tokens, "create", _tokens_create, "a short-lived token for one of the account's "
                                                              "people's browser; printed once")
    token.add_argument("--scopes", default="read", metavar="SCOPE,...",
                       help="read (the default), create, upload; comma-separated")
    token.add_argument("--job", dest="jobs", action="append", metavar="JOB_ID",
                       help="only this job, and the jobs it creates (repeatable; default: every job)")
    token.add_argument("--ttl", type=int, metavar="S", help="seconds it lives, 60-3600 (default 900)")
    token.add_argument("--credit-ceiling", type=int, metavar="N",
                       help="with create: what its jobs may reserve together, in credits")

    plans = groups.add_parser("plans", help="named sets of limits").add_subparsers(dest="action", required=True)
    plan = command(plans, "set", _plans_set, "make or change a plan: every account on it takes its limits at once")
    plan.add_argument("name", metavar="NAME")
    _add_limits(plan, changing=False, only=_PLAN_LIMITS)
    command(plans, "list", _plans_list, "your plans: name, concurrency, queued, daily cap, per-job max, accounts")

    trail = command(groups, "audit", _audit, "what your platform keys changed, newest first")
    trail.add_argument("--account", metavar="ACCOUNT_ID", help="only what was done to or for this account")
    trail.add_argument("-L", "--limit", type=int, default=50, help="show at most this many (default 50)")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _rows(args: argparse.Namespace, items: list[Any], cells: Callable[[Any], tuple[object, ...]]) -> None:
    for item in items:
        if args.json:
            show.json_line(item)
        else:
            print("\t".join(_cell(value) for value in cells(item)))


def _note(text: str) -> None:
    show.err.print(text, markup=False)


def _account_row(a: PlatformAccount) -> tuple[object, ...]:
    return a.id, a.external_id, a.name, a.plan, a.status, a.credits.available


def _plan_row(p: Plan) -> tuple[object, ...]:
    return p.name, p.concurrent_jobs, p.max_queued_jobs, p.daily_spend_cap, p.max_job_credits, p.accounts


def _show_account(args: argparse.Namespace, a: PlatformAccount) -> None:
    if args.json:
        show.json_line(a)
        return
    c, limits = a.credits, a.limits
    print(f"{a.id}\t{a.name} (external id {_cell(a.external_id)})\n"
          f"status: {a.status}{'' if a.disabled_at is None else f' since {_cell(a.disabled_at)}'}; "
          f"plan: {a.plan or '- (limits of its own)'}\n"
          f"credit: {c.available} available ({c.balance} balance, {c.reserved} reserved)\n"
          f"limits: {limits.concurrent_jobs} at once, {_cell(limits.max_queued_jobs)} queued, daily cap "
          f"{_cell(limits.daily_spend_cap)}, per-job max {_cell(limits.max_job_credits)} (-: none or the default)")


def _whoami(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        me = platform.whoami()
    if args.json:
        show.json_line(me)
    else:
        print(f"{me.platform}\t{me.platform_id}\t{me.key_id}\t{','.join(me.scopes)}")
    return Exit.OK


def _accounts_create(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        account = platform.create_account(args.external_id, name=args.name, plan=args.plan, **_limits(args))
    if args.json:
        show.json_line(account)
    else:
        print(account.id)
    return Exit.OK


def _accounts_list(args: argparse.Namespace) -> Exit:
    found: list[PlatformAccount] = []
    with _platform(args) as platform:
        for account in platform.iter_accounts(external_id=args.external_id, limit=max(1, min(args.limit, 100))):
            if len(found) >= args.limit:
                break
            found.append(account)
    _rows(args, found, _account_row)
    return Exit.OK


def _accounts_show(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        _show_account(args, platform.get_account(args.account_id))
    return Exit.OK


def _accounts_set(args: argparse.Namespace) -> Exit:
    limits = _limits(args)
    if not limits and not hasattr(args, "name") and not hasattr(args, "plan"):
        raise ConfigError("nothing to change: give --name, --plan or a limit (--concurrency, --daily-cap ...)")
    with _platform(args) as platform:
        account = platform.update_account(args.account_id, name=getattr(args, "name", None),
                                          plan=getattr(args, "plan", None), **limits)
    _show_account(args, account)
    return Exit.OK


def _accounts_disable(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        done = platform.disable_account(args.account_id, running="stop" if args.stop_running else "finish",
                                        reason=args.reason)
    _note(f"{done.account.id} disabled; {len(done.jobs_canceled)} job(s) canceled")
    _rows(args, [done] if args.json else done.jobs_canceled, lambda job_id: (job_id,))
    return Exit.OK


def _accounts_enable(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        account = platform.enable_account(args.account_id)
    _rows(args, [account], lambda a: (a.id, a.status))
    return Exit.OK


def _accounts_delete(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        deleted = platform.delete_account(args.account_id)
    _note(f"{deleted.id} closed: {deleted.keys_revoked} API key(s) revoked, {len(deleted.jobs_canceled)} live "
          "job(s) canceled; its data is being removed")
    _rows(args, [deleted] if args.json else deleted.jobs_canceled, lambda job_id: (job_id,))
    return Exit.OK


def _credit(args: argparse.Namespace, action: str) -> Exit:
    with _platform(args) as platform:
        change = platform.grant_credits if action == "grant" else platform.take_back_credits
        done = change(args.account_id, args.amount, idempotency_key=args.idempotency_key, reason=args.reason)
    if done.replayed:
        _note(f"idempotency key {args.idempotency_key!r} was used before for this change; nothing changed now")
    _rows(args, [done], lambda d: (d.credits.balance,))
    return Exit.OK


def _credits_grant(args: argparse.Namespace) -> Exit:
    return _credit(args, "grant")


def _credits_take_back(args: argparse.Namespace) -> Exit:
    return _credit(args, "take_back")


def _credits_ledger(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        page = platform.ledger(args.account_id, limit=max(1, min(args.limit, 100)))
    _rows(args, page.data, lambda e: (e.id, e.at, e.kind, e.balance_change, e.balance_after, e.job_id, e.note))
    return Exit.OK


def _keys_create(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        made = platform.create_key(args.account_id, name=args.name)
    _note(f"created {made.id} for {args.account_id}; the key is shown once, below")
    _rows(args, [made], lambda k: (k.key,))
    return Exit.OK


def _keys_list(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        keys = platform.list_keys(args.account_id)
    _rows(args, keys, lambda k: (k.id, k.name or None, k.prefix, k.created_at, k.last_used_at, k.revoked_at))
    return Exit.OK


def _keys_revoke(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        platform.revoke_key(args.account_id, args.key_id)
    _note(f"revoked {args.key_id}: refused from now on, with the browser tokens it issued")
    return Exit.OK


def _tokens_create(args: argparse.Namespace) -> Exit:
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    with _platform(args) as platform:
        token = platform.create_token(args.account_id, scopes=scopes, jobs=args.jobs, ttl_s=args.ttl,
                                      credit_ceiling=args.credit_ceiling)
    _note(f"{token.id} ({','.join(token.scopes)}) expires at {_cell(token.expires_at)}; shown once, below")
    _rows(args, [token], lambda t: (t.token,))
    return Exit.OK


def _plans_set(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        plan = platform.put_plan(args.name, **_limits(args))
    _rows(args, [plan], _plan_row)
    return Exit.OK


def _plans_list(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        plans = platform.list_plans()
    _rows(args, plans, _plan_row)
    return Exit.OK


def _audit(args: argparse.Namespace) -> Exit:
    with _platform(args) as platform:
        page = platform.audit(account_id=args.account, limit=max(1, min(args.limit, 100)))
    _rows(args, page.data, lambda a: (a.id, a.at, a.platform_key_id, a.action, a.account_id, a.status, a.target))
    return Exit.OK
