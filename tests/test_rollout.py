"""Rollout routing: a model alias sends each of its configured shares of jobs to a real model, and every
route is measured by real model and outcome."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.stack import running_stack, stack_settings
from vidjobs.common.settings import RouteShare
from vidjobs.providers.rollout import route

ROUTES = {"house/default": [RouteShare(model="fake/default", share=80), RouteShare(model="fake-poll/default",
                                                                                      share=20)]}


def test_shares_split_the_unit_interval_in_order():
    picks = [route("house/default", ROUTES, draw=d / 100)[0] for d in range(100)]
    assert Counter(picks) == {"fake/default": 80, "fake-poll/default": 20}
    assert route("fake/default", ROUTES) == ("fake/default", None)  # not an alias: untouched


async def test_an_alias_spreads_jobs_over_its_models_and_each_route_is_measured(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, model_routes=ROUTES)
    async with running_stack(settings) as stack:
        jobs = await asyncio.gather(*(stack.create_job(model="house/default", params={"render_s": 0.1})
                                      for _ in range(40)))
        finals = await asyncio.gather(*(stack.wait_terminal(j["id"], within=90) for j in jobs))
        metrics = {name: await stack.metrics(name) for name in ("poller", "media")}

    models = Counter(j["model"] for j in finals)
    assert set(models) == {"fake/default", "fake-poll/default"} and sum(models.values()) == 40
    assert models["fake/default"] > models["fake-poll/default"]  # 80/20, give or take chance
    assert all(j["status"] == "completed" for j in finals)
    completed = 'vidjobs_route_jobs_total{model="fake/default",outcome="completed",route="house/default"}'
    assert completed in metrics["media"]
    assert 'vidjobs_route_job_seconds_count{model="fake-poll/default",route="house/default"}' in metrics["media"]

