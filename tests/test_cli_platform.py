"""`vidjobs platform-keys ...` as an operator runs it (on the database) and `vidjobs platform ...` as a product's
engineer runs it (through the API with the platform key the operator made): keys made, listed, rotated and
revoked; accounts, plans, credit, keys and browser tokens through a real gateway on PostgreSQL and NATS; the
audit trail read from both sides; and the exit status and message of each mistake.

The operator's first key is made by `vidjobs` in a subprocess, as a shell runs it; the many commands after it
run the same entry point in this process (`Command`), which keeps the module to seconds on a small machine."""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime, timedelta

import pytest

from tests.gateway_harness import JOB_BODY, auth, gateway_settings, running_gateway
from tests.support import Run, operator_command
from vidjobs.cli.__main__ import main
from vidjobs.cli.exitcodes import Exit
from vidjobs.gateway.platformkeys import hash_key

_ONE_AT_A_TIME = threading.Lock()  # a command's stdout, stderr and environment are the process's own


class Command:
    """`vidjobs ...` through its `main`, in a thread of this process: its parser, handlers, output and exit
    status, with only `env`'s VIDJOBS_* variables set while it runs."""

    def __init__(self, **env: str) -> None:
        self.env = {f"VIDJOBS_{name.upper()}": value for name, value in env.items()}

    async def __call__(self, *args: str) -> Run:
        return await asyncio.to_thread(self._run, list(args))

    def _run(self, args: list[str]) -> Run:
        out, err = io.StringIO(), io.StringIO()
        with _ONE_AT_A_TIME:
            saved = _swap_settings(self.env)
            try:
                with redirect_stdout(out), redirect_stderr(err):
                    try:
                        code = main(args)
                    except SystemExit as exit:  # argparse refusing the command line
                        code = int(exit.code or 0)
            finally:
                _swap_settings(saved)
        return Run(code, out.getvalue(), err.getvalue())


def _swap_settings(env: dict[str, str]) -> dict[str, str]:
    """Make `env` the process's only VIDJOBS_* variables; returns those it replaced."""
    replaced = {name: os.environ.pop(name) for name in [n for n in os.environ if n.startswith("VIDJOBS_")]}
    os.environ.update(env)
    return replaced


@pytest.fixture
def vidjobs(database_url: str) -> Command:
    return Command(database_url=database_url)


async def _each(*runs) -> list[Run]:
    """The commands one after another (they share this process's stdout), in the order given."""
    return [await run for run in runs]


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _rows(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.splitlines()]


async def _key_row(pool, key: str):
    return await pool.fetchrow("SELECT k.*, p.name AS platform FROM platform_keys k JOIN platforms p "
                               "ON p.id = k.platform_id WHERE key_hash = $1", hash_key(key))


async def test_the_operator_makes_lists_rotates_and_revokes_platform_keys(vidjobs: Command, pool):
    made, act, other, unknown, empty, soon, unnamed = await _each(
        vidjobs("platform-keys", "create", "--platform", "shop", "--scopes", "credits, accounts", "--name", "backend",
                "--expires-in", "30d"),
        vidjobs("platform-keys", "create", "--platform", "shop", "--scopes", "act"),
        vidjobs("platform-keys", "create", "--platform", "other", "--scopes", "usage"),
        vidjobs("platform-keys", "create", "--platform", "shop", "--scopes", "accounts,mint"),
        vidjobs("platform-keys", "create", "--platform", "shop", "--scopes", " , "),
        vidjobs("platform-keys", "create", "--platform", "shop", "--scopes", "act", "--expires-in", "soon"),
        vidjobs("platform-keys", "create", "--platform", "  ", "--scopes", "act"),
    )
    # Only the key, on one line: `KEY=$(vidjobs platform-keys create ...)` works.
    assert made.code == 0 and made.out.startswith("vjp_") and made.out.count("\n") == 1, made.err
    assert "shown once" in made.err and "expires in 30d" in made.err
    row = await _key_row(pool, made.out.strip())
    assert (row["platform"], row["name"], row["scopes"]) == ("shop", "backend", ["accounts", "credits"])
    assert abs(row["expires_at"] - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)
    assert made.out.strip() not in json.dumps([dict(r) for r in await pool.fetch("SELECT prefix, name "
                                                                                 "FROM platform_keys")])
    assert unknown.code == Exit.USAGE and unknown.out == ""
    assert "not a scope: mint" in unknown.err and "accounts, credits, keys, tokens, usage, act" in unknown.err
    assert empty.code == Exit.USAGE and "name at least one scope" in empty.err
    assert soon.code == Exit.USAGE and "a span such as 90m, 24h or 30d" in soon.err
    assert unnamed.code == Exit.USAGE and "--platform" in unnamed.err and "1-100" in unnamed.err
    assert await pool.fetchval("SELECT count(*) FROM platform_keys") == 3

    act_id = (await _key_row(pool, act.out.strip()))["id"]
    listed, table, nobody, rotated, rotate_unknown, revoke_unknown, audit_unknown = await _each(
        vidjobs("platform-keys", "list", "--json"), vidjobs("platform-keys", "list", "--platform", "shop"),
        vidjobs("platform-keys", "list", "--platform", "nobody"),
        vidjobs("platform-keys", "rotate", row["id"], "--overlap", "1h"),
        vidjobs("platform-keys", "rotate", "pk_nope"), vidjobs("platform-keys", "revoke", "pk_nope"),
        vidjobs("platform-keys", "audit", "--platform", "nobody"),
    )
    keys = _json_lines(listed.out)
    assert [(k["platform"], k["scopes"]) for k in keys] == [("shop", ["accounts", "credits"]), ("shop", ["act"]),
                                                           ("other", ["usage"])]
    assert set(keys[0]) == {"id", "platform", "name", "prefix", "scopes", "created_at", "last_used_at",
                            "expires_at", "revoked_at"}
    assert not [k for k in (made.out.strip(), act.out.strip(), other.out.strip()) if k in listed.out]
    header, *lines = table.out.splitlines()
    assert header.split()[:5] == ["id", "platform", "name", "prefix", "scopes"] and len(lines) == 2
    assert lines[0].split()[:5] == [row["id"], "shop", "backend", made.out[:10], "accounts,credits"]
    assert nobody.code == 0 and nobody.out.count("\n") == 1 and "no platform keys for 'nobody'" in nobody.err

    # Rotated: a new key with the same platform, name and scopes; the old one works for the overlap.
    assert rotated.code == 0 and rotated.out.startswith("vjp_") and "works for 1h more" in rotated.err
    new = await _key_row(pool, rotated.out.strip())
    old = await _key_row(pool, made.out.strip())
    assert (new["platform"], new["name"], new["scopes"]) == ("shop", "backend", ["accounts", "credits"])
    assert abs(old["expires_at"] - (datetime.now(UTC) + timedelta(hours=1))) < timedelta(minutes=1)
    for failed in (rotate_unknown, revoke_unknown):
        assert failed.code == Exit.NOT_FOUND and "no platform key 'pk_nope'" in failed.err
        assert "vidjobs platform-keys list" in failed.err
    assert audit_unknown.code == Exit.NOT_FOUND and "no platform 'nobody'" in audit_unknown.err

    revoked = await vidjobs("platform-keys", "revoke", act_id)
    again, rotate_revoked = await _each(vidjobs("platform-keys", "revoke", act_id),
                                                 vidjobs("platform-keys", "rotate", act_id))
    assert revoked.code == 0 and revoked.out == "" and f"revoked {act_id}" in revoked.err
    assert (await _key_row(pool, act.out.strip()))["revoked_at"] is not None
    assert again.code == 0 and "already revoked" in again.err
    assert rotate_revoked.code == Exit.REFUSED and "revoked or expired" in rotate_revoked.err
    assert "platform-keys create" in rotate_revoked.err


async def test_a_products_engineer_runs_the_platform_commands_with_the_operators_key(tmp_path, database_url,
                                                                                    nats_url, pool):
    operator = Command(database_url=database_url)
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as h:
        # As a shell runs it: `KEY=$(vidjobs platform-keys create ...)`.
        made = await operator_command(database_url)("platform-keys", "create", "--platform", "shop", "--scopes",
                                                    "accounts,credits,keys,tokens,usage,act")
        narrow = await operator("platform-keys", "create", "--platform", "shop", "--scopes", "accounts")
        assert made.code == 0 and made.out.startswith("vjp_") and made.out.count("\n") == 1, made.err
        key, narrow_key = made.out.strip(), narrow.out.strip()
        settings = {"url": h.settings.gateway_url, "config": str(tmp_path / "config.json")}
        vidjobs = Command(platform_key=key, **settings)
        narrowly = Command(platform_key=narrow_key, **settings)
        keyless = Command(**settings)

        plan, me, no_key, second = await _each(
            vidjobs("platform", "plans", "set", "pro", "--concurrency", "3", "--daily-cap", "5000"),
            vidjobs("platform", "whoami"), keyless("platform", "whoami"),
            vidjobs("platform", "accounts", "create", "--external-id", "user_2", "--max-queued", "5", "--json"))
        acct = await vidjobs("platform", "accounts", "create", "--external-id", "user_1", "--name", "Ada", "--plan",
                             "pro")
        assert plan.code == 0, plan.err
        assert _rows(plan.out) == [["pro", "3", "-", "5000", "-", "0"]]
        assert _rows(me.out)[0][0] == "shop" and _rows(me.out)[0][3] == "accounts,act,credits,keys,tokens,usage"
        assert no_key.code == Exit.USAGE and "VIDJOBS_PLATFORM_KEY" in no_key.err
        assert "vidjobs platform-keys create" in no_key.err
        assert acct.code == 0 and acct.out.startswith("acct_"), acct.err
        account_id = acct.out.strip()
        assert _json_lines(second.out)[0]["limits"]["max_queued_jobs"] == 5

        (again, listed, one, shown, granted, plans, key_made, token, nothing, bad_scope, unknown_account,
         scoped) = await _each(
            vidjobs("platform", "accounts", "create", "--external-id", "user_1"),
            vidjobs("platform", "accounts", "list"),
            vidjobs("platform", "accounts", "list", "--external-id", "user_2", "--json"),
            vidjobs("platform", "accounts", "show", account_id),
            vidjobs("platform", "credits", "grant", account_id, "500", "--idempotency-key", "evt_1", "--reason",
                    "purchase"),
            vidjobs("platform", "plans", "list", "--json"),
            vidjobs("platform", "keys", "create", account_id, "--name", "server"),
            vidjobs("platform", "tokens", "create", account_id, "--scopes", "read,create", "--ttl", "120",
                    "--credit-ceiling", "50"),
            vidjobs("platform", "accounts", "set", account_id),
            vidjobs("platform", "tokens", "create", account_id, "--scopes", "write"),
            vidjobs("platform", "accounts", "show", "acct_nope"),
            narrowly("platform", "credits", "grant", account_id, "5", "--idempotency-key", "evt_2"))
        assert again.out.strip() == account_id  # the same user again: the same account
        # Oldest first: user_2 was made before user_1.
        assert [r[:5] for r in _rows(listed.out)] == [[_json_lines(second.out)[0]["id"], "user_2", "user_2", "-",
                                                      "active"], [account_id, "user_1", "Ada", "pro", "active"]]
        assert [a["external_id"] for a in _json_lines(one.out)] == ["user_2"]
        assert shown.out.startswith(f"{account_id}\tAda (external id user_1)") and "plan: pro" in shown.out
        assert granted.code == 0 and granted.out == "500\n", granted.err
        assert [(p["name"], p["accounts"]) for p in _json_lines(plans.out)] == [("pro", 1)]
        assert key_made.out.startswith("vj_") and "shown once" in key_made.err
        assert (await h.get(key_made.out.strip(), "/v1/account"))[1]["id"] == account_id
        assert token.out.startswith("vjt_") and "(create,read) expires at" in token.err
        assert (await h.get(token.out.strip(), "/v1/jobs"))[0] == 200
        assert nothing.code == Exit.USAGE and "nothing to change" in nothing.err
        assert bad_scope.code == Exit.API_ERROR and "scopes" in bad_scope.err and "HTTP 422" in bad_scope.err
        assert unknown_account.code == Exit.API_ERROR and "not_found" in unknown_account.err
        assert "request req_" in unknown_account.err
        assert scoped.code == Exit.API_ERROR and "`credits` scope" in scoped.err and "HTTP 403" in scoped.err

        replayed, reused, keys, changed = await _each(
            vidjobs("platform", "credits", "grant", account_id, "500", "--idempotency-key", "evt_1", "--reason",
                    "purchase"),
            vidjobs("platform", "credits", "grant", account_id, "900", "--idempotency-key", "evt_1"),
            vidjobs("platform", "keys", "list", account_id),
            vidjobs("platform", "accounts", "set", account_id, "--max-job", "300", "--daily-cap", "none"))
        # A limit given without a plan is the account's own: it is taken off its plan.
        assert changed.code == 0 and "per-job max 300" in changed.out and "daily cap -" in changed.out
        assert "plan: - (limits of its own)" in changed.out
        assert replayed.code == 0 and replayed.out == "500\n" and "used before" in replayed.err
        assert reused.code == Exit.API_ERROR and "idempotency_key" in reused.err and "conflict" in reused.err
        [[key_id, name, *_]] = _rows(keys.out)
        assert name == "server"

        resp = await h.client.post("/v1/jobs", json=JOB_BODY, headers={**auth(key), "Vidjobs-Account": account_id})
        job_id = (await resp.json())["id"]
        taken, revoked, revoke_unknown = await _each(
            vidjobs("platform", "credits", "take-back", account_id, "200", "--idempotency-key", "refund_1"),
            vidjobs("platform", "keys", "revoke", account_id, key_id),
            vidjobs("platform", "keys", "revoke", account_id, "key_nope"))
        assert taken.code == 0 and taken.out == "300\n", taken.err
        assert revoked.code == 0 and revoked.out == "" and f"revoked {key_id}" in revoked.err
        assert revoke_unknown.code == Exit.API_ERROR and "not_found" in revoke_unknown.err

        ledger = await vidjobs("platform", "credits", "ledger", account_id)
        assert [(r[2], r[3]) for r in _rows(ledger.out)] == [("grant", "-200"), ("reserve", "0"), ("grant", "500")]
        assert [r[6] for r in _rows(ledger.out)][::2] == ["credit taken back", "purchase"]
        disabled = await vidjobs("platform", "accounts", "disable", account_id, "--stop-running", "--reason", "unpaid")
        assert disabled.out == f"{job_id}\n" and "1 job(s) canceled" in disabled.err
        enabled = await vidjobs("platform", "accounts", "enable", account_id)
        assert enabled.out == f"{account_id}\tactive\n"
        deleted = await vidjobs("platform", "accounts", "delete", account_id, "--json")
        assert _json_lines(deleted.out)[0]["keys_revoked"] == 0 and "closed" in deleted.err

        # The audit trail, as the product reads it and as the operator does: newest first, each change.
        trail, operator_trail, every_platform, revoked_key = await _each(
            vidjobs("platform", "audit", "--account", account_id),
            operator("platform-keys", "audit", "--platform", "shop", "--account", account_id, "--json"),
            operator("platform-keys", "audit", "--limit", "2"),
            operator("platform-keys", "revoke", (await _key_row(pool, narrow_key))["id"]))
        actions = [r[3] for r in _rows(trail.out)]
        assert actions[:3] == ["delete_platform_account", "enable_platform_account", "disable_platform_account"]
        assert {"create_job", "change_platform_account_credit", "revoke_platform_account_key",
                "update_platform_account", "create_platform_account_token"} <= set(actions)
        lines = _json_lines(operator_trail.out)
        assert [line["action"] for line in lines] == actions and all(line["request_id"] for line in lines)
        header, *two = every_platform.out.splitlines()
        assert header.split()[:4] == ["id", "at", "platform", "key"] and len(two) == 2
        assert revoked_key.code == 0
        # A key revoked before a gateway has seen it is refused at once (a seen one within platformkeys.CACHE_S).
        spare = (await operator("platform-keys", "create", "--platform", "shop", "--scopes", "usage")).out.strip()
        await operator("platform-keys", "revoke", (await _key_row(pool, spare))["id"])
        refused = await Command(platform_key=spare, **settings)("platform", "whoami")
        assert refused.code == Exit.API_ERROR and "HTTP 401" in refused.err and "revoked" in refused.err

