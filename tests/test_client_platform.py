"""The Python client's platform calls (`Platform`, `AsyncPlatform`) against a real gateway on PostgreSQL and NATS:
a product's backend makes its users' accounts, sets their plans and limits, grants and takes back credit once per
event, issues keys and browser tokens, disables, deletes and acts for an account, and reads the audit trail; a
reused idempotency key, an unknown key, a missing scope and a stranger's account answer the client's typed
errors. The models are held to the API's OpenAPI document, like the account client's."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import msgspec
import pytest

from tests.gateway_harness import gateway_settings, running_gateway
from vidjobs.cli import platforms
from vidjobs.common.settings import Settings
from vidjobs.gateway.app import route_table
from vidjobs.gateway.openapi import document
from vidjobs.gateway.platformkeys import Scope
from vidjobs_client import (
    APIError,
    AsyncClient,
    AsyncPlatform,
    AuthenticationError,
    Client,
    ConfigurationError,
    Conflict,
    InvalidRequest,
    NotFound,
    Platform,
    models,
)

ALL_SCOPES = [s.value for s in Scope]


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def platform_key(h: Any, scopes: list[str] | None = None) -> str:
    async with h.pool.acquire() as conn:
        return (await platforms.create(conn, f"app-{secrets.token_hex(3)}", scopes or ALL_SCOPES))[1]


def _manage(url: str, key: str) -> dict[str, Any]:
    """What a product's backend does over a user's life, with the synchronous client; what it saw, by name."""
    seen: dict[str, Any] = {}
    with Platform(url, key) as platform:
        seen["whoami"] = platform.whoami()
        seen["plan"] = platform.put_plan("pro", concurrent_jobs=3, daily_spend_cap=5_000)
        made = platform.create_account("user_1", name="Ada", plan="pro")
        seen["made"], seen["again"] = made, platform.create_account("user_1", name="someone else")
        for n in (2, 3):
            platform.create_account(f"user_{n}", max_queued_jobs=5)
        seen["plans"] = platform.list_plans()
        seen["all"] = [a.external_id for a in platform.iter_accounts(limit=2)]
        seen["first_page"] = platform.list_accounts(limit=2)
        seen["one"] = platform.list_accounts(external_id="user_3").data
        seen["updated"] = platform.update_account(made.id, name="Ada L.", max_job_credits=300,
                                                  daily_spend_cap=None)
        seen["replanned"] = platform.update_account(made.id, plan="pro")

        seen["granted"] = platform.grant_credits(made.id, 100_000, idempotency_key="evt_1", reason="purchase")
        seen["replayed"] = platform.grant_credits(made.id, 100_000, idempotency_key="evt_1", reason="purchase")
        with pytest.raises(Conflict) as reused:
            platform.grant_credits(made.id, 900, idempotency_key="evt_1")
        seen["reused"] = reused.value
        seen["taken"] = platform.take_back_credits(made.id, 40_000, idempotency_key="refund_1")
        seen["ledger"] = platform.ledger(made.id, limit=10)
        seen["usage"] = platform.usage(made.id, group_by="model")

        seen["key"] = platform.create_key(made.id, name="server")
        seen["keys"] = platform.list_keys(made.id)
        platform.revoke_key(made.id, seen["key"].id)
        seen["keys_after"] = platform.list_keys(made.id)
        with pytest.raises(NotFound) as unknown_key:
            platform.revoke_key(made.id, "key_" + "0" * 26)
        seen["unknown_key"] = unknown_key.value
        seen["token"] = platform.create_token(made.id, scopes=["read", "create"], ttl_s=120, credit_ceiling=50)

        with platform.acting_for(made.id) as vj:
            seen["job"] = vj.create_job("fake/default", "a red fox in snow", duration_s=1)
            seen["acting_account"] = vj.account()
            seen["own_token"] = vj.create_token(jobs=[seen["job"].id])
        seen["disabled"] = platform.disable_account(made.id, running="stop", reason="unpaid")
        seen["enabled"] = platform.enable_account(made.id)
        seen["audit"] = list(platform.iter_audit(account_id=made.id, limit=3))
        seen["deleted"] = platform.delete_account(made.id)
        seen["audit_page"] = platform.audit(limit=1)
        with pytest.raises(NotFound) as gone:
            platform.get_account(made.id)
        seen["gone"] = gone.value
    return seen


async def test_a_platform_manages_its_users_accounts_with_the_sync_client(h):
    key = await platform_key(h)
    seen = await asyncio.to_thread(_manage, h.settings.gateway_url, key)

    assert seen["whoami"].scopes == sorted(ALL_SCOPES) and seen["whoami"].platform.startswith("app-")
    made, again = seen["made"], seen["again"]
    assert made.id.startswith("acct_") and (made.external_id, made.name, made.plan) == ("user_1", "Ada", "pro")
    assert made.limits.concurrent_jobs == 3 and made.limits.daily_spend_cap == 5_000 and made.status == "active"
    assert again == made  # the same user again: the account made first, unchanged
    assert [(p.name, p.concurrent_jobs, p.accounts) for p in seen["plans"]] == [("pro", 3, 1)]
    assert seen["all"] == ["user_1", "user_2", "user_3"]
    assert len(seen["first_page"].data) == 2 and seen["first_page"].next_cursor
    assert [a.external_id for a in seen["one"]] == ["user_3"] and seen["one"][0].limits.max_queued_jobs == 5
    updated = seen["updated"]
    assert (updated.name, updated.plan, updated.limits.max_job_credits, updated.limits.daily_spend_cap) == \
        ("Ada L.", None, 300, None)
    assert seen["replanned"].plan == "pro" and seen["replanned"].limits.daily_spend_cap == 5_000

    granted, replayed = seen["granted"], seen["replayed"]
    assert not granted.replayed and replayed.replayed and replayed.entry.id == granted.entry.id
    assert granted.credits.balance == 100_000 and granted.entry.note == "purchase"
    reused = seen["reused"]
    assert reused.status == 409 and reused.code == "conflict" and "idempotency_key" in reused.message
    assert reused.request_id
    assert seen["taken"].credits.balance == 60_000 and seen["taken"].entry.balance_change == -40_000
    assert [(e.kind, e.balance_change) for e in seen["ledger"].data] == [("grant", -40_000), ("grant", 100_000)]
    assert seen["usage"].group_by == "model" and seen["usage"].data == []

    issued = seen["key"]
    assert issued.key.startswith("vj_") and issued.name == "server" and issued.revoked_at is None
    assert [k.id for k in seen["keys"]] == [issued.id]
    assert seen["keys_after"][0].revoked_at is not None
    assert seen["unknown_key"].status == 404
    token = seen["token"]
    assert token.token.startswith("vjt_") and token.account_id == made.id and token.scopes == ["create", "read"]
    assert token.credit_ceiling == 50 and token.jobs is None

    # Acting for the account: its own routes, its own credit, a token of its own for one job.
    assert seen["job"].status == "pending" and seen["acting_account"].id == made.id
    assert seen["own_token"].jobs == [seen["job"].id] and seen["own_token"].scopes == ["read"]
    disabled = seen["disabled"]
    assert disabled.account.status == "disabled" and disabled.jobs_canceled == [seen["job"].id]
    assert seen["enabled"].status == "active" and seen["enabled"].disabled_at is None

    actions = [line.action for line in seen["audit"]]
    assert actions[:3] == ["enable_platform_account", "disable_platform_account", "create_account_token"]
    assert {"create_job", "change_platform_account_credit", "update_platform_account"} <= set(actions)
    assert all(line.account_id == made.id and line.request_id for line in seen["audit"])
    # The whole trail, a page of one: the last change (the audit itself is a read, not a change).
    [last] = seen["audit_page"].data
    assert last.action == "delete_platform_account" and seen["audit_page"].next_cursor
    assert seen["deleted"].id == made.id and seen["deleted"].keys_revoked == 0
    assert seen["gone"].code == "not_found"


async def test_the_async_platform_its_refusals_and_an_account_minting_its_own_token(h):
    key, narrow, theirs = await platform_key(h), await platform_key(h, ["accounts"]), await platform_key(h)
    _, api_key = await h.account()
    url = h.settings.gateway_url
    async with AsyncPlatform(url, key) as platform, AsyncPlatform(url, narrow) as limited, \
            AsyncPlatform(url, theirs) as stranger:
        account = await platform.create_account("async_user")
        assert [a.id async for a in platform.iter_accounts()] == [account.id]
        assert (await platform.grant_credits(account.id, 500, idempotency_key="e1")).credits.available == 500
        with pytest.raises(Conflict, match="reserved"):
            await platform.take_back_credits(account.id, 600, idempotency_key="r1")
        with pytest.raises(Conflict, match="idempotency_key"):
            await platform.take_back_credits(account.id, 100, idempotency_key="e1")
        with pytest.raises(InvalidRequest, match="ttl_s"):
            await platform.create_token(account.id, ttl_s=5)
        with pytest.raises(InvalidRequest, match="plan"):
            await platform.create_account("planned", plan="nope")
        with pytest.raises(APIError) as no_scope:
            await limited.grant_credits(account.id, 5, idempotency_key="e2")
        with pytest.raises(NotFound):
            await stranger.get_account(account.id)
        async with stranger.acting_for(account.id) as foreign:
            with pytest.raises(NotFound):
                await foreign.account()
        async with AsyncPlatform(url, "vjp_not_a_key") as unknown:
            with pytest.raises(AuthenticationError):
                await unknown.whoami()

        async with platform.acting_for(account.id) as vj:
            job = await vj.create_job("fake/default", "a fox", duration_s=1)
            token = await vj.create_token(jobs=[job.id], ttl_s=60)
        # The token reads the job it names, and nothing of the platform.
        async with AsyncClient(url, token.token) as browser:
            assert (await browser.get_job(job.id)).id == job.id
            with pytest.raises(APIError) as refused:
                await browser.create_job("fake/default", "another", duration_s=1)
        [plan] = [await platform.put_plan("team", concurrent_jobs=4, fallback_models=[])]
        assert (await platform.list_plans()) == [plan]
        assert (await platform.disable_account(account.id)).jobs_canceled == [job.id]
        assert (await platform.enable_account(account.id)).status == "active"
        assert (await platform.update_account(account.id, plan="team")).limits.concurrent_jobs == 4
        assert [k.name for k in (await platform.list_keys(account.id))] == []
        made = await platform.create_key(account.id, name="ci")
        await platform.revoke_key(account.id, made.id)
        # Newest first: the job's estimate reserved and released, after the grant.
        ledger = (await platform.ledger(account.id)).data
        assert [(e.kind, e.balance_change) for e in ledger] == [("release", 0), ("reserve", 0), ("grant", 500)]
        assert [g.by_status for g in (await platform.usage(account.id)).data] == [{"canceled": 1}]
        assert (await platform.audit(account_id=account.id, limit=1)).data[0].action == "revoke_platform_account_key"
        assert (await platform.whoami()).key_id.startswith("pk_")
        assert (await platform.list_accounts(external_id="async_user")).data[0].id == account.id
        assert (await platform.delete_account(account.id)).keys_revoked == 0

    # An account's own API key mints its browser token too.
    def own_token() -> models.BrowserToken:
        with Client(url, api_key) as vj:
            return vj.create_token(scopes=["read", "upload"], ttl_s=3600)

    mine = await asyncio.to_thread(own_token)
    assert no_scope.value.status == 403 and "credits" in no_scope.value.message
    assert refused.value.status == 403 and "create" in refused.value.message
    assert token.jobs == [job.id] and token.scopes == ["read"]
    assert mine.token.startswith("vjt_") and mine.scopes == ["read", "upload"] and mine.jobs is None


# Each platform model and the API schema it decodes: the same fields, so neither drifts from the other.
_SCHEMAS = {
    models.PlatformInfo: "PlatformOut", models.PlatformLimits: "PlatformLimitsOut",
    models.PlatformAccount: "PlatformAccountOut", models.PlatformAccountPage: "PlatformAccountPage",
    models.DisabledAccount: "DisabledOut", models.DeletedAccount: "DeletedAccountOut",
    models.CreditChange: "CreditChangeOut", models.Plan: "PlanOut", models.PlanList: "PlanList",
    models.ApiKey: "KeyOut", models.NewApiKey: "NewKeyOut", models.ApiKeyList: "KeyList",
    models.BrowserToken: "TokenOut", models.AuditEntry: "AuditEntryOut", models.AuditPage: "AuditPage",
}


def test_the_platform_models_have_the_fields_the_api_documents():
    schemas = document(route_table(Settings(fake_provider="on")))["components"]["schemas"]
    for struct, name in _SCHEMAS.items():
        encoded = {field.encode_name for field in msgspec.structs.fields(struct)}
        assert encoded == set(schemas[name]["properties"]), (struct.__name__, name)
    assert set(models.AccountLimits.__annotations__) == \
        set(schemas["CreatePlatformAccount"]["properties"]) - {"external_id", "name", "plan"}
    assert set(models.AccountLimits.__annotations__) == set(schemas["PatchPlatformAccount"]["properties"]) - {
        "name", "plan"}
    assert set(models.PlanLimits.__annotations__) == set(schemas["Plan"]["properties"])


def test_the_platform_clients_are_alike_documented_and_need_a_key(monkeypatch):
    for client in (Platform, AsyncPlatform):
        public = [name for name in vars(client) if not name.startswith("_")]
        assert not [name for name in public if not getattr(client, name).__doc__], client
    assert sorted(name for name in vars(Platform) if not name.startswith("_")) == \
        sorted(name for name in vars(AsyncPlatform) if not name.startswith("_"))
    monkeypatch.delenv("VIDJOBS_PLATFORM_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="VIDJOBS_PLATFORM_KEY"):
        Platform("http://127.0.0.1:1")
    monkeypatch.setenv("VIDJOBS_PLATFORM_KEY", "vjp_from_the_environment")
    with Platform("http://127.0.0.1:1") as platform, platform.acting_for("acct_1") as vj:
        assert vj.account_id == "acct_1" and vj.base_url == platform.base_url == "http://127.0.0.1:1"
