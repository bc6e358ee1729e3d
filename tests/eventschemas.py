"""The wire rule for events (docs/UPGRADES.md), against a recorded snapshot of every event's schema.

During a rolling upgrade the previous release and this one publish to, and consume from, the same streams,
so each must decode what the other sends. For every event recorded in tests/event_schemas.json:
- it keeps its tag and its subject, and every recorded field keeps its name and its type exactly (a wider
  type breaks an older reader of a newer message, a narrower one a newer reader of an older message);
- a field it gained since has a default, so a message from a release without it still decodes;
- no event omits defaults (an older reader may require a field the newer one would leave out) or refuses
  unknown fields (an older reader must skip the fields a newer release added);
- a new event travels on a subject of its own: an older consumer refuses any event it does not know on the
  subject it reads (a poison message, dead-lettered).

`python -m tests.eventschemas` records events added since the snapshot (and fields added with defaults); it
refuses while any event breaks the rule, so the snapshot only ever grows."""

from __future__ import annotations

import json
import sys
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from vidjobs.common import events

SNAPSHOT = Path(__file__).with_name("event_schemas.json")
HINT_SUBJECTS = {events.JobChanged: f"{events.CHANGED_PREFIX}.*", events.QueueMoved: f"{events.QUEUE_PREFIX}.*"}
# The names a recorded type is spelled with; anything else is refused rather than guessed at.
TYPE_NAMES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "datetime": datetime,
                              "list": list, "dict": dict, "None": None}


def type_name(tp: Any) -> str:
    """A field's type as it is recorded: `str`, `list[str]`, `int | None`."""
    if tp is None or tp is type(None):
        return "None"
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " | ".join(type_name(a) for a in args)
    if args:
        return f"{type_name(typing.get_origin(tp))}[{', '.join(type_name(a) for a in args)}]"
    name = getattr(tp, "__name__", repr(tp))
    if name not in TYPE_NAMES:
        raise TypeError(f"an event field of type {tp!r}: teach tests/eventschemas.py how to record it")
    return name


def parse_type(name: str) -> Any:
    return eval(name, {"__builtins__": {}}, TYPE_NAMES)  # noqa: S307 - names from TYPE_NAMES only


def describe(cls: type[msgspec.Struct], subject: str) -> dict[str, Any]:
    """One event as the snapshot records it."""
    fields: dict[str, Any] = {}
    for f in msgspec.structs.fields(cls):
        entry: dict[str, Any] = {"type": type_name(f.type)}
        if f.required:
            entry["required"] = True
        elif f.default is not msgspec.NODEFAULT:
            entry["default"] = msgspec.to_builtins(f.default)
        else:
            entry["default_factory"] = type_name(f.default_factory)
        fields[f.encode_name] = entry
    schema = msgspec.json.schema(cls)["$defs"][cls.__name__]
    config = cls.__struct_config__
    return {"class": cls.__name__, "subject": subject, "tag_field": config.tag_field,
            "omit_defaults": config.omit_defaults, "forbid_unknown_fields": config.forbid_unknown_fields,
            "fields": fields,
            "schema": {"properties": schema["properties"], "required": schema.get("required", [])}}


def current() -> dict[str, dict[str, Any]]:
    """Every event of vidjobs.common.events, by tag."""
    found: dict[str, dict[str, Any]] = {}
    kinds = [(cls, subject) for subject, form in events.SUBJECT_EVENTS.items()
             for cls in typing.get_args(form) or (form,)]
    for cls, subject in [*kinds, *HINT_SUBJECTS.items()]:
        found[str(cls.__struct_config__.tag)] = describe(cls, subject)
    return found


def recorded() -> dict[str, dict[str, Any]]:
    return dict(json.loads(SNAPSHOT.read_text())["events"])


def violations(snapshot: dict[str, dict[str, Any]], today: dict[str, dict[str, Any]]) -> list[str]:
    """Where `today`'s events break the wire rule against `snapshot`'s; empty when they keep it."""
    found: list[str] = []
    for tag, was in snapshot.items():
        now = today.get(tag)
        if now is None:
            found.append(f"{tag}: removed (or its tag renamed); a release still running publishes it")
            continue
        found += _changed(tag, was, now)
    recorded_subjects = {e["subject"] for e in snapshot.values()}
    for tag, now in today.items():
        if tag not in snapshot and now["subject"] in recorded_subjects:
            found.append(f"{tag}: a new event on {now['subject']}, which a consumer of the previous release "
                         "reads and would dead-letter it on: give it a subject of its own")
        found += _config(tag, now)
    return found


def _changed(tag: str, was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    found = []
    if now["subject"] != was["subject"]:
        found.append(f"{tag}: moved from {was['subject']} to {now['subject']}")
    if now["tag_field"] != was["tag_field"]:
        found.append(f"{tag}: its tag field changed from {was['tag_field']!r} to {now['tag_field']!r}")
    for name, field in was["fields"].items():
        if name not in now["fields"]:
            found.append(f"{tag}.{name}: removed or renamed; the previous release requires or reads it")
        elif now["fields"][name]["type"] != field["type"]:
            found.append(f"{tag}.{name}: type changed from {field['type']} to {now['fields'][name]['type']}")
    for name, field in now["fields"].items():
        if name not in was["fields"] and field.get("required"):
            found.append(f"{tag}.{name}: added without a default; a message of the previous release lacks it")
    return found


def _config(tag: str, now: dict[str, Any]) -> list[str]:
    found = []
    if now["omit_defaults"]:
        found.append(f"{tag}: omits defaults; an older reader may require a field left out")
    if now["forbid_unknown_fields"]:
        found.append(f"{tag}: forbids unknown fields; it could not read a newer release's message")
    return found


def shaped(tag: str, entry: dict[str, Any]) -> type[msgspec.Struct]:
    """A Struct of the recorded shape: how a release that knew only the snapshot reads and writes `tag`."""
    fields: list[Any] = []
    for name, field in entry["fields"].items():
        tp = parse_type(field["type"])
        if field.get("required"):
            fields.append((name, tp))
        elif "default" in field:
            fields.append((name, tp, msgspec.convert(field["default"], tp)))
        else:
            fields.append((name, tp, msgspec.field(default_factory=parse_type(field["default_factory"]))))
    required = [f for f in fields if len(f) == 2]
    optional = [f for f in fields if len(f) == 3]
    return msgspec.defstruct(entry["class"], [*required, *optional], tag=tag, tag_field=entry["tag_field"])


def main() -> int:
    today = current()
    snapshot = recorded() if SNAPSHOT.exists() else {}
    if broken := violations(snapshot, today):
        print("not recorded: the events break the wire rule\n  " + "\n  ".join(broken), file=sys.stderr)
        return 1
    # Recorded fields stay as recorded (a default given later does not make them optional on the wire).
    merged = {tag: _merge(snapshot.get(tag), entry) for tag, entry in today.items()}
    body = {"note": "Recorded by `python -m tests.eventschemas`; the rule is in tests/eventschemas.py.",
            "events": dict(sorted(merged.items()))}
    SNAPSHOT.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
    print(f"recorded {len(merged)} events in {SNAPSHOT}")
    return 0


def _merge(was: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, Any]:
    if was is None:
        return now
    return {**now, "fields": {**now["fields"], **was["fields"]},
            "schema": {"properties": {**now["schema"]["properties"], **was["schema"]["properties"]},
                       "required": was["schema"]["required"]}}


if __name__ == "__main__":
    sys.exit(main())
