"""Rollout routing: a model alias sends each of its configured shares of accounts to a real model, and every
route is measured by real model and outcome."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.stack import demo_key, running_stack, stack_settings
from vidjobs.common.modelroutes import AliasRoutes
from vidjobs.common.settings import RouteShare
from vidjobs.providers.rollout import pick

ROUTES = {"house/default": [RouteShare(model="fake/default", share=80), RouteShare(model="fake-poll/default",
                                                                                      share=20)]}


def test_shares_split_the_unit_interval_in_order():
    routes = AliasRoutes(version=0, shares=tuple(ROUTES["house/default"]))
    picks = [pick(routes, d / 100) for d in range(100)]
    assert Counter(picks) == {"fake/default": 80, "fake-poll/default": 20}
    assert picks[:80] == ["fake/default"] * 80


async def test_an_alias_spreads_jobs_over_its_models_and_each_route_is_measured(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, model_routes=ROUTES)
    async with running_stack(settings) as stack:
        # The pick is sticky per account (vidjobs.providers.rollout): the shares hold across accounts.
        accounts = [stack.as_key(await demo_key(settings.database_url)) for _ in range(40)]
        jobs = await asyncio.gather(*(account.create_job(model="house/default", params={"render_s": 0.1})
                                      for account in accounts))
        finals = await asyncio.gather(*(account.wait_terminal(j["id"], within=90)
                                        for account, j in zip(accounts, jobs, strict=True)))
        metrics = {name: await stack.metrics(name) for name in ("poller", "media")}

    models = Counter(j["model"] for j in finals)
    assert set(models) == {"fake/default", "fake-poll/default"} and sum(models.values()) == 40
    assert models["fake/default"] > models["fake-poll/default"]  # 80/20, give or take chance
    assert all(j["status"] == "completed" for j in finals)
    completed = 'vidjobs_route_jobs_total{model="fake/default",outcome="completed",route="house/default"}'
    assert completed in metrics["media"]
    assert 'vidjobs_route_job_seconds_count{model="fake-poll/default",route="house/default"}' in metrics["media"]

