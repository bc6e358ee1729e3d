"""Prometheus metrics, created once per process with bounded labels (never a job id).

What a job's moves count (transitions, errors, durations) is counted once the move has committed
(`transitions.transition` defers it with `changes.on_commit`): a handler rolled back or redelivered adds
nothing. Gauges read from the database are exported by one service each (vidjobs.reaper.gauges,
vidjobs.submitter.provider_gauges); docs/RUNBOOK.md says how to query them across replicas.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

OUTBOX_PUBLISHED = Counter("vidjobs_outbox_published_total", "Outbox events published to JetStream")
OUTBOX_FAILURES = Counter("vidjobs_outbox_failures_total", "Outbox relay passes that failed and were retried")
CHANGE_HINTS_LOST = Counter("vidjobs_change_hints_lost_total", "Job change hints that could not be sent to NATS")
# What the estimates of waiting jobs cost (vidjobs.common.estimates): reads of a provider's queue, a model's
# measurements, an account's load. Each is shared by every reader in the process for a refresh interval, so
# this grows with providers and time, not with waiting jobs or open streams.
ESTIMATE_READS = Counter("vidjobs_estimate_reads_total", "Reads the estimates of waiting jobs made, by what they read",
                         ["what"])

MESSAGES = Counter(
    "vidjobs_messages_total", "Work messages handled, by consumer and outcome", ["consumer", "outcome"]
)
HANDLE_SECONDS = Histogram(
    "vidjobs_message_handle_seconds", "Time to handle one work message", ["consumer"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# Handlers at work now. What the workers scale on: unlike JetStream's ack-pending count it leaves out the
# messages deferred until later (a waiting recovery check, a job held back by a provider's limits).
IN_HANDLING = Gauge("vidjobs_messages_in_handling", "Work messages being handled now, by consumer", ["consumer"])
TRANSITIONS = Counter(
    "vidjobs_job_transitions_total", "Job status changes committed", ["to_status"]
)
# A job's life runs from seconds (fake renders) to the render deadline (15 minutes by default) and beyond.
_JOB_BUCKETS = (1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
JOB_READY_SECONDS = Histogram(
    "vidjobs_job_ready_seconds", "Creation to completion of every completed job", ["provider", "model"],
    buckets=_JOB_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "vidjobs_job_stage_seconds", "Time a job spent in a stage (queued, submitted, rendering, downloading), "
    "observed when it left the stage", ["stage", "provider", "model"], buckets=_JOB_BUCKETS,
)
JOBS_FINISHED = Counter(
    "vidjobs_jobs_finished_total", "Jobs that reached an ending (completed, failed, canceled)",
    ["provider", "model", "status"],
)
PROVIDER_CALLS = Counter(
    "vidjobs_provider_calls_total", "Calls to providers by operation and outcome",
    ["provider", "operation", "outcome"],
)
ROUTE_JOBS = Counter(
    "vidjobs_route_jobs_total", "Finished jobs sent down a rollout route, by real model and outcome",
    ["route", "model", "outcome"],
)
ROUTE_SECONDS = Histogram(
    "vidjobs_route_job_seconds", "Creation to finish of jobs sent down a rollout route", ["route", "model"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 3600),
)
JOB_MOVES = Counter("vidjobs_job_moves_total",
                    "Waiting jobs moved to a fallback model, by the model they left and the one they moved to, "
                    "the alias they were routed through ('' for none) and why (breaker, max_wait)",
                    ["from_model", "to_model", "route", "reason"])
# Created jobs that render again what their account already had ready (vidjobs.common.regenerations), once each.
REGENERATIONS = Counter("vidjobs_regenerations_total",
                        "Created jobs that are a rerun, or repeat the model and normalised prompt of a job of "
                        "their account ready within VIDJOBS_REGENERATION_WINDOW_S", ["model"])
JOB_ERRORS = Counter("vidjobs_job_errors_total",
                     "Committed moves to retrying or failed, by the error the job took and its provider",
                     ["code", "provider"])
# How the end of each render was learned: its callback, the poll schedule of a provider without callbacks,
# the delayed recovery check (a callback lost or late) or a poll asked for otherwise. The share of
# `recovery_poll` per provider is what to read before changing VIDJOBS_RECOVERY_DELAY_S (docs/RUNBOOK.md).
COMPLETIONS = Counter("vidjobs_completions_total",
                      "Finished renders, counted once when the move to downloading commits, by provider and how "
                      "the finish was learned (callback, scheduled_poll, recovery_poll, requested_poll)",
                      ["provider", "learned_by"])
UNMATCHED_CALLBACKS = Counter("vidjobs_callbacks_unmatched_total",
                              "Stored callbacks whose render no job claimed in time, or naming a job id no row "
                              "holds (its render asked to stop while it runs); kept in provider_answers",
                              ["provider"])
