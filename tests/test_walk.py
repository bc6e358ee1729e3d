"""bench/walk.py, the job walk: on one job through the real stack, it follows the job through every process and
sorts each handler's repeats (the gateway's POST enters routes_jobs once, nothing there is back-and-forth or a
cycle, and PyAV's own files are not first-party); and its classifier tells a planted back-and-forth and cycle
from leaf and hub calls."""

from __future__ import annotations

from bench.walk import SERVICES, Entry, classify, report, walk
from tests.workspace import member, members


async def test_the_walk_sorts_the_repeats_of_one_job_through_every_process(database_url, nats_url):
    result = await walk(database_url=database_url, nats_url=nats_url, settle_s=1.0, grace_s=0.5)

    # Every file recorded is a member's, named as it is on disk: none of PyAV's (av/error.py), none installed.
    owners = {m.module.removeprefix("vidjobs.").split(".")[0] for m in members()}
    for path in result.files():
        assert path.split("/")[0] in owners, path
    for path in result.files("gateway", "handler"):
        service, _, rest = path.partition("/")
        if service == "gateway":
            assert (member("vidjobs.gateway").source / rest).is_file(), path

    post = next(u for u in result.processes["gateway"] if "gateway/routes_jobs.py" in u.files)
    assert post.files.count("gateway/routes_jobs.py") == 1
    shape = post.shape(result.leaves())
    assert "gateway/tenant.py" not in {e.path for e in shape.cycles}
    assert shape.back_and_forth == {}, shape.back_and_forth
    assert shape.leaf_calls["common/requestids.py"] >= 2  # read for each log line: a leaf, however often

    # The job's messages: submitted, its callback's signal handled, its render stored.
    for service in ("submitter", "poller", "media"):
        assert any(path.startswith(f"{service}/") for path in result.files(service, "handler")), service
    text = report(result)
    for service in SERVICES:
        assert f"\n== {service}: " in text and f"\n  {service}: " in text
    assert "\ntotal: " in text and "distinct first-party files over 5 processes" in text


def test_the_classifier_tells_back_and_forth_and_cycles_from_leaf_and_hub_calls():
    def entered(*stack: str) -> Entry:
        return Entry(stack[-1], stack[:-1])

    shape = classify([
        entered("bus", "worker"),
        entered("bus", "worker", "logs"),  # a leaf, from two doors
        entered("bus", "worker", "slots"),  # a hub's calls: slots -> capacity twice
        entered("bus", "worker", "slots", "capacity"),
        entered("bus", "worker", "slots", "capacity", "inflight"),
        entered("bus", "worker", "slots", "dispatch"),
        entered("bus", "worker", "slots", "capacity"),
        entered("bus", "worker", "slots", "capacity", "inflight"),
        entered("bus", "worker", "jobs"),  # back-and-forth: jobs from worker, then from transitions
        entered("bus", "worker", "jobs", "db"),
        entered("bus", "worker", "transitions"),
        entered("bus", "worker", "transitions", "jobs"),
        entered("bus", "worker", "transitions", "jobs", "db"),
        entered("bus", "worker", "transitions", "logs"),
        entered("bus", "worker", "backoff"),  # a cycle: backoff calls back into worker
        entered("bus", "worker", "backoff", "worker"),
    ])

    assert shape.leaf_calls["logs"] == 2 and shape.leaf_callers["logs"] == {"worker", "transitions"}
    assert shape.hub_calls == {"capacity": ("slots", 2)}
    assert list(shape.back_and_forth) == ["jobs"]
    assert [e.caller for e in shape.back_and_forth["jobs"]] == ["worker", "transitions"]
    assert [(e.path, e.chain) for e in shape.cycles] == [("worker", ("bus", "worker", "backoff"))]
