"""Operating it, against the real stack: every metric the alert rules and the dashboard query is exported by
some service once jobs have run (one completed, one failed, one stuck), and the gauges and histograms say
what is true of those jobs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncpg
import yaml

from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common.states import NON_TERMINAL, STAGE_OF
from vidjobs.reaper.system_gauges import UNFINISHED_SQL

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "k8s" / "components" / "monitoring" / "monitoring.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "vidjobs.json"
RUNBOOK = ROOT / "docs" / "RUNBOOK.md"
SERVICES = ("gateway", "submitter", "poller", "media", "reaper")
# Ours only: jetstream_*, kube_* and `up` come from the NATS exporter, kube-state-metrics and Prometheus.
OUR_NAME = re.compile(r"\bvidjobs_[A-Za-z0-9_]+")
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)")


def _rules() -> list[dict]:
    groups = [g for doc in yaml.safe_load_all(RULES.read_text()) if doc["kind"] == "PrometheusRule"
              for g in doc["spec"]["groups"]]
    return [rule for g in groups for rule in g["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


def referenced_metrics() -> set[str]:
    exprs = [rule["expr"] for rule in _rules()] + _dashboard_exprs()
    return {name for expr in exprs for name in OUR_NAME.findall(expr)}


def samples(text: str) -> dict[tuple[str, str], float]:
    """(name, labels) -> value of every sample line; names keep their _total/_bucket/_sum/_count suffixes."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and (m := SAMPLE.match(line)):
            out[m.group(1), m.group(2) or ""] = float(m.group(3))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    for (sample, sample_labels), v in samples(text).items():
        if sample == name and wanted <= set(sample_labels.strip("{}").split(",")):
            return v
    return None


def total(scraped: dict[str, str], name: str, **labels: str) -> float:
    """A counter summed over the services, as a query without a component label sums it."""
    return sum(value(text, name, **labels) or 0 for text in scraped.values())


def test_every_alert_has_a_runbook_section_and_the_stuck_job_alert_comes_first():
    alerts = [rule for rule in _rules() if "alert" in rule]
    headings = {line[3:].strip().lower() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    runbook_order = [line[3:].strip() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")]

    assert alerts[0]["alert"] == "VidjobsJobStuck" and runbook_order[0] == "VidjobsJobStuck"
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url.split("#")[0].endswith("docs/RUNBOOK.md"), alert["alert"]
        assert url.split("#")[1] == alert["alert"].lower() and alert["alert"].lower() in headings, alert["alert"]


async def test_the_stack_exports_every_metric_the_alerts_and_dashboard_use(tmp_path, database_url, nats_url):
    # No recovery check comes due during the test, so the stuck job stays in the stage it reached.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=600, recovery_interval_s=600)
    async with running_stack(settings) as stack:
        done = await stack.create_job(params={"render_s": 0.1})
        refused = await stack.create_job(params={"scenario": "content_rejected"})
        stuck = await stack.create_job(params={"scenario": "hang"})
        await stack.wait_for_status(done["id"], "completed")
        await stack.wait_for_status(refused["id"], "failed")
        # The hang scenario reports the render started, then nothing: it rests in processing (waiting for
        # submitted or processing alike raced the callback that moves it on).
        stuck_status = (await stack.wait_for_status(stuck["id"], "processing"))["status"]
        stage = STAGE_OF[stuck_status].value

        # The reaper reads its gauges on a timer: wait for a read that has seen all three jobs move.
        async def settled():
            text = await stack.metrics("reaper")
            return text if value(text, "vidjobs_jobs_unfinished", status=stuck_status) == 1 else None

        first = await wait_until(settled, within=60, what="the reaper's gauges to see the stuck job")
        later = await wait_until(lambda: _older(stack, stage, first), within=60, what="the stuck job's age to grow")
        await wait_until(lambda: _rendering_at_fake(stack), within=60, what="the submitter's gauges to see it")
        async with stack.session.get(f"{stack.url}/v1/jobs/{stuck['id']}/stream", headers=stack.auth) as sse:
            await sse.content.readline()  # the stream is open once its first event arrives
            scraped = {name: await stack.metrics(name) for name in SERVICES}
        in_db = await _unfinished_in_db(settings.database_url)

    exported = {name for text in scraped.values() for name, _ in samples(text)}
    assert referenced_metrics() - exported == set()
    # The gauges: the stuck job alone is unfinished, and its stage's oldest age grows while it sits there.
    for status in NON_TERMINAL:
        assert value(later, "vidjobs_jobs_unfinished", status=status.value) == in_db.get(status.value, 0)
    assert value(later, "vidjobs_job_oldest_stage_age_seconds", stage=stage) > \
        value(first, "vidjobs_job_oldest_stage_age_seconds", stage=stage) > 0
    assert value(later, "vidjobs_job_oldest_stage_age_seconds", stage="downloading") == 0
    assert value(scraped["submitter"], "vidjobs_provider_renders_in_flight", provider="fake") == 1
    assert value(scraped["submitter"], "vidjobs_provider_breaker_state", provider="fake", state="closed") == 1
    assert value(scraped["gateway"], "vidjobs_sse_streams_open") == 1
    # Every service observes the pauses of its cycle collections (vidjobs.common.gcpolicy, installed once up).
    for name, text in scraped.items():
        assert (value(text, "vidjobs_gc_pause_seconds_count", generation="0") or 0) > 0, name
    assert value(later, "vidjobs_consumer_pending_messages", consumer="submitter") is not None
    # Committed outcomes, once each: one refusal, one completion with its create -> ready time.
    fake = {"provider": "fake", "model": "fake/default"}
    assert total(scraped, "vidjobs_job_errors_total", code="content_rejected") == 1
    assert total(scraped, "vidjobs_jobs_finished_total", status="failed", **fake) == 1
    assert total(scraped, "vidjobs_job_ready_seconds_count", **fake) == 1
    assert total(scraped, "vidjobs_job_stage_seconds_count", stage="downloading", **fake) == 1
    assert total(scraped, "vidjobs_job_stage_seconds_count", stage="queued", **fake) == 3


async def _older(stack, stage: str, first: str) -> str | None:
    text = await stack.metrics("reaper")
    before = value(first, "vidjobs_job_oldest_stage_age_seconds", stage=stage)
    return text if value(text, "vidjobs_job_oldest_stage_age_seconds", stage=stage) > before else None


async def _rendering_at_fake(stack) -> bool:
    # The submitter also reads its gauges on a timer.
    return value(await stack.metrics("submitter"), "vidjobs_provider_renders_in_flight", provider="fake") == 1


async def _unfinished_in_db(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        return {r["status"]: r["jobs"] for r in await conn.fetch(UNFINISHED_SQL)}
    finally:
        await conn.close()


async def test_the_unfinished_jobs_query_reads_only_the_index_of_unfinished_jobs(database_url):
    conn = await asyncpg.connect(database_url)
    try:
        predicate = await conn.fetchval("SELECT pg_get_expr(indpred, indrelid) FROM pg_index "
                                        "WHERE indexrelid = 'jobs_unfinished'::regclass")
        await conn.execute("SET enable_seqscan = off")  # an empty table would be scanned whatever the indexes
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {UNFINISHED_SQL}"))
    finally:
        await conn.close()

    assert set(re.findall(r"'(\w+)'", predicate)) == {s.value for s in NON_TERMINAL}
    assert "jobs_unfinished" in plan and "Seq Scan" not in plan

