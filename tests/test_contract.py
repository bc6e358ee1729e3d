"""What this checkout publishes, held to what the previous release published (docs/RELEASES.md): a route, a
field, an enum value, an error code, an event field or a setting that release had may go or change meaning
only with a line under CHANGELOG.md's Unreleased naming it in backticks (tests/contractdiff.py).

The previous release is the one CHANGELOG.md records (tests/releases.py); what it published is the record
committed when it was cut (docs/contracts/<version>.json), made by that release's own code.
tests/test_mixed_fleet.py, which installs that release anyway, checks the record against it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests import contractdiff, releases
from tests.published_contract import published

ENTRIES_HEADER = ["### Removed"]


@pytest.fixture(scope="module")
def current() -> dict[str, Any]:
    # Through JSON, as the recorded release's was: enums become their values, tuples lists.
    return json.loads(json.dumps(published(), default=lambda v: getattr(v, "value", str(v))))


@pytest.fixture(scope="module")
def previous() -> dict[str, Any]:
    release, full = releases.previous_release()
    recorded = contractdiff.recorded(release.version)
    assert recorded["commit"] == full, f"docs/contracts/{release.version}.json was recorded from another commit"
    return recorded


def test_nothing_the_previous_release_published_changed_without_a_changelog_line(previous, current):
    entries = releases.unreleased_entries(releases.CHANGELOG.read_text())
    missing = contractdiff.unacknowledged(contractdiff.changes(previous, current), entries)
    assert not missing, ("changed since the previous release, and not named in backticks under Unreleased in "
                         "CHANGELOG.md:\n" + "\n".join(f"- {c.what} (name one of {c.names})" for c in missing))


# The differ itself, on the recorded document changed by hand: each kind of change is found, and a changelog
# line naming it (only it) acknowledges it.

def _changed(previous: dict[str, Any], change: Any) -> list[contractdiff.Change]:
    edited = copy.deepcopy(previous)
    change(edited)
    return contractdiff.changes(previous, edited)


def test_the_unchanged_record_has_no_change(previous):
    assert contractdiff.changes(previous, copy.deepcopy(previous)) == []


def test_a_removed_response_field_fails_without_a_line_naming_it_and_passes_with_one(previous):
    def drop(doc: dict[str, Any]) -> None:
        job = doc["openapi"]["components"]["schemas"]["JobOut"]
        del job["properties"]["error"]
        job["required"] = [f for f in job.get("required", []) if f != "error"]

    found = _changed(previous, drop)
    assert [c.what for c in found] == ["field JobOut.error is gone"]
    assert contractdiff.unacknowledged(found, [*ENTRIES_HEADER, "- The job's `outputs` moved."]) == found
    assert contractdiff.unacknowledged(found, ["- `JobOut.error` is gone: read `failure` instead."]) == []
    assert contractdiff.unacknowledged(found, ["- `error` is gone from the job."]) == []
    # Named without backticks is not named.
    assert contractdiff.unacknowledged(found, ["- JobOut.error is gone."]) == found


def test_a_removed_route_and_a_removed_error_code_are_each_found(previous):
    def drop(doc: dict[str, Any]) -> None:
        del doc["openapi"]["paths"]["/v1/jobs/{job_id}/rerun"]
        del doc["error_codes"]["render_timeout"]
        schemas = doc["openapi"]["components"]["schemas"]
        for enum in (schemas["ErrorBody"]["properties"]["code"], schemas["ErrorCode"]):
            enum["enum"].remove("render_timeout")

    found = _changed(previous, drop)
    assert "route POST /v1/jobs/{job_id}/rerun is gone" in [c.what for c in found]
    assert "error code render_timeout is gone" in [c.what for c in found]
    assert contractdiff.unacknowledged(found, ["- `POST /v1/jobs/{job_id}/rerun` and `render_timeout` are gone."]) \
        == []
    left = contractdiff.unacknowledged(found, ["- `render_timeout` is gone."])
    assert [c.what for c in left] == ["route POST /v1/jobs/{job_id}/rerun is gone"]


def test_changes_of_meaning_are_found(previous):
    def change(doc: dict[str, Any]) -> None:
        schemas = doc["openapi"]["components"]["schemas"]
        schemas["CreateJob"]["properties"]["prompt"] = {"type": "integer"}  # a type changed
        schemas["CreateJob"]["required"] = [*schemas["CreateJob"]["required"], "seed"]  # now required of a client
        schemas["JobStatus"]["enum"].remove("expired")  # an enum narrowed
        doc["error_codes"]["timeout"]["retryable"] = False  # a code's meaning
        doc["events"]["job.queued"]["fields"]["job_id"]["type"] = "int"
        del doc["settings"]["VIDJOBS_RETENTION_DAYS"]

    found = {c.what.split(":")[0] for c in _changed(previous, change)}
    assert found == {
        "field CreateJob.prompt changed type", "field CreateJob.seed is now required of a client",
        "JobStatus no longer takes the value 'expired'", "error code timeout changed meaning",
        "event field job.queued.job_id changed type", "setting VIDJOBS_RETENTION_DAYS is gone",
    }


def test_additions_are_not_changes(previous):
    def add(doc: dict[str, Any]) -> None:
        schemas = doc["openapi"]["components"]["schemas"]
        schemas["JobOut"]["properties"]["tags"] = {"type": "array", "items": {"type": "string"}}
        schemas["JobStatus"]["enum"].append("paused")
        doc["openapi"]["paths"]["/v1/tags"] = {"get": {"responses": {}}}
        doc["error_codes"]["gone"] = {"statuses": [410], "in_job": False, "retryable": None}
        doc["settings"]["VIDJOBS_TAGS"] = {"type": "str"}

    assert _changed(previous, add) == []
