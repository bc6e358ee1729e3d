"""Events keep the wire rule (tests/eventschemas.py) against tests/event_schemas.json, recorded from the
events as the previous release (110046d) and this one both define them (and the optional fields this release
adds, each also decoded here without it): a message either release publishes decodes in the other."""

from __future__ import annotations

import typing
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from tests import eventschemas
from vidjobs.common import events

SNAPSHOT = eventschemas.recorded()
WORK_TAGS = sorted(tag for tag, e in SNAPSHOT.items() if e["subject"] in events.SUBJECT_EVENTS)


def sample(tp: Any) -> Any:
    """A value of type `tp` as a producer would send it."""
    if tp is datetime:
        return datetime(2026, 12, 2, 15, 44, 35, tzinfo=UTC)
    if tp in (str, int, float, bool):
        return {str: "job_0123456789", int: 7, float: 1.5, bool: True}[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return [sample(args[0])]
    if origin is dict:
        return {sample(args[0]): sample(args[1])}
    if args:  # a union: its first member
        return sample(args[0])
    raise TypeError(f"no sample for {tp!r}")


def old_decoder(subject: str) -> msgspec.json.Decoder[Any]:
    """How a consumer of the recorded release decodes `subject`: a union of the recorded events on it."""
    kinds = tuple(eventschemas.shaped(t, e) for t, e in SNAPSHOT.items() if e["subject"] == subject)
    return msgspec.json.Decoder(typing.Union[kinds] if len(kinds) > 1 else kinds[0])  # noqa: UP007


def today_event(tag: str) -> events.Event:
    cls = next(c for c in typing.get_args(events.Event) if c.__struct_config__.tag == tag)
    return cls(**{f.name: sample(f.type) for f in msgspec.structs.fields(cls)})


def test_todays_events_keep_the_rule_against_the_snapshot():
    assert eventschemas.violations(SNAPSHOT, eventschemas.current()) == []


def test_every_event_is_recorded():
    """A new event is recorded (`python -m tests.eventschemas`), so that the next change to it is held to
    the rule too."""
    assert set(eventschemas.current()) == set(SNAPSHOT)


@pytest.mark.parametrize("tag", WORK_TAGS)
def test_todays_event_decodes_in_the_recorded_shape(tag: str):
    """A newer producer, an older consumer: every recorded field comes through as sent."""
    event = today_event(tag)
    subject = events.subject_for(event)
    read = old_decoder(subject).decode(events.encode(event))
    assert type(read).__struct_config__.tag == tag
    for name in SNAPSHOT[tag]["fields"]:
        assert getattr(read, name) == getattr(event, name)


@pytest.mark.parametrize("tag", WORK_TAGS)
def test_an_event_in_the_recorded_shape_decodes_today(tag: str):
    """An older producer, a newer consumer: the message lacks whatever was added since, and still decodes."""
    entry = SNAPSHOT[tag]
    old = eventschemas.shaped(tag, entry)
    sent = old(**{f.name: sample(f.type) for f in msgspec.structs.fields(old)})
    read = events.decode(entry["subject"], msgspec.json.encode(sent))
    assert events.tag_of(read) == tag
    assert all(getattr(read, name) == getattr(sent, name) for name in entry["fields"])


# Fields this release adds to a recorded event (each with a default): the previous release's event lacks them.
ADDED_SINCE_PREVIOUS = {"cancel.requested": ["model_name"]}


@pytest.mark.parametrize(("tag", "added"), ADDED_SINCE_PREVIOUS.items())
def test_a_field_this_release_adds_is_absent_or_skipped_in_the_previous_release(tag: str, added: list[str]):
    """The previous release's shape is the recorded one less the fields added since: its message (without
    them) decodes today with their defaults, and today's message (with them) decodes in its consumer."""
    entry = SNAPSHOT[tag]
    assert set(added) <= set(entry["fields"])
    previous = eventschemas.shaped(tag, {**entry, "fields": {name: field for name, field in entry["fields"].items()
                                                             if name not in added}})
    sent = previous(**{f.name: sample(f.type) for f in msgspec.structs.fields(previous)})

    read = events.decode(entry["subject"], msgspec.json.encode(sent))
    today = today_event(tag)
    read_there = msgspec.json.decode(events.encode(today), type=previous)

    defaults = {f.name: f.default for f in msgspec.structs.fields(type(today))}
    assert all(getattr(read, name) == defaults[name] for name in added)
    assert all(getattr(read_there, f.name) == getattr(today, f.name) for f in msgspec.structs.fields(previous))
    assert not any(hasattr(read_there, name) for name in added)


def test_the_hints_decode_both_ways():
    changed = today_event("job.changed")
    assert isinstance(changed, events.JobChanged)
    assert old_decoder(SNAPSHOT["job.changed"]["subject"]).decode(events.encode(changed)).at == changed.at
    old = eventschemas.shaped("job.changed", SNAPSHOT["job.changed"])
    assert events.decode_change(msgspec.json.encode(old(job_id="j", status="completed", at=changed.at))).job_id == "j"


def _rule_on(modified: type[msgspec.Struct]) -> list[str]:
    tag = modified.__struct_config__.tag
    assert isinstance(tag, str)
    today = {**eventschemas.current(), tag: eventschemas.describe(modified, events.SUBMIT)}
    return eventschemas.violations(SNAPSHOT, today)


class JobQueuedWithAttempt(msgspec.Struct, tag="job.queued"):
    job_id: str
    attempt: int  # required: a message of the previous release lacks it


def test_the_rule_catches_a_required_field_added_to_an_event():
    assert _rule_on(JobQueuedWithAttempt) == [
        "job.queued.attempt: added without a default; a message of the previous release lacks it"]
    # ... and it is right to: the message the previous release sends is refused by such a consumer.
    previous = msgspec.json.encode(eventschemas.shaped("job.queued", SNAPSHOT["job.queued"])(job_id="j"))
    with pytest.raises(msgspec.ValidationError, match="attempt"):
        msgspec.json.decode(previous, type=JobQueuedWithAttempt)


def test_a_field_added_with_a_default_passes_the_rule():
    class JobQueuedWithLane(msgspec.Struct, tag="job.queued"):
        job_id: str
        lane: int = 0

    assert _rule_on(JobQueuedWithLane) == []


def test_the_rule_catches_a_removed_renamed_or_retyped_field_and_a_new_event_on_an_old_subject():
    class Renamed(msgspec.Struct, tag="job.queued"):
        job: str

    class Retyped(msgspec.Struct, tag="job.queued"):
        job_id: int

    class Strict(msgspec.Struct, tag="job.queued", forbid_unknown_fields=True):
        job_id: str

    class SlotTaken(msgspec.Struct, tag="slot.taken"):
        provider: str

    assert _rule_on(Renamed) == ["job.queued.job_id: removed or renamed; the previous release requires or reads it",
                                 "job.queued.job: added without a default; a message of the previous release lacks it"]
    assert _rule_on(Retyped) == ["job.queued.job_id: type changed from str to int"]
    assert _rule_on(Strict) == ["job.queued: forbids unknown fields; it could not read a newer release's message"]
    assert len(_rule_on(SlotTaken)) == 1 and "a new event on vidjobs.work.submit" in _rule_on(SlotTaken)[0]
