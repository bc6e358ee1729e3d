"""What changed, for a client, an operator or the other release of a rolling upgrade, between what a release
published (tests/published_contract.py) and what this checkout publishes: each change that can break
something that worked against the release, with the names a changelog line may give it.

A change is acknowledged when a line under CHANGELOG.md's `## [Unreleased]` names it in backticks: the route's
path (or `METHOD path`), the field (`name` or `Schema.name`), the enum value or error code, the event's tag or
field, the setting (`VIDJOBS_NAME`). tests/test_contract.py holds this checkout to the previous release.

    python -m tests.contractdiff --record 0.1.0   # docs/contracts/0.1.0.json, from that release's own code
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import releases

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "docs" / "contracts"
EXTRACTOR = Path(__file__).with_name("published_contract.py")


@dataclass(frozen=True)
class Change:
    what: str  # in words
    names: tuple[str, ...]  # any one of them, in backticks under Unreleased, acknowledges it


def unacknowledged(changes: list[Change], entries: list[str]) -> list[Change]:
    named = releases.named(entries)
    return [c for c in changes if not named & set(c.names)]


def changes(previous: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    return [*_routes(previous["openapi"], current["openapi"]), *_schemas(previous["openapi"], current["openapi"]),
            *_error_codes(previous["error_codes"], current["error_codes"]),
            *_events(previous["events"], current["events"]), *_settings(previous["settings"], current["settings"])]


_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _routes(previous: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    found = []
    for path, operations in previous["paths"].items():
        for method in operations:
            if method in _METHODS and method not in current["paths"].get(path, {}):
                route = f"{method.upper()} {path}"
                found.append(Change(f"route {route} is gone", (path, route)))
    return found


def _refs(node: Any) -> set[str]:
    """The component schemas a part of the document names, directly."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        own = {ref.rsplit("/", 1)[1]} if isinstance(ref, str) else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _reached(start: set[str], schemas: dict[str, Any]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name not in seen and name in schemas:
            seen.add(name)
            todo += _refs(schemas[name])
    return seen


def _response_side(doc: dict[str, Any]) -> set[str]:
    """The schemas an answer carries (a client reads them); the rest are what a client sends (bodies, queries)."""
    answers = {n for ops in doc["paths"].values() for op in ops.values() if isinstance(op, dict)
               for n in _refs(op.get("responses", {}))}
    return _reached(answers, doc["components"]["schemas"])


def _request_side(doc: dict[str, Any]) -> set[str]:
    schemas = doc["components"]["schemas"]
    sent = {n for ops in doc["paths"].values() for op in ops.values() if isinstance(op, dict)
            for n in _refs(op.get("requestBody", {}))}
    return _reached(sent, schemas) | (set(schemas) - _response_side(doc))


def shape(schema: Any) -> Any:
    """A schema's type, without its words, bounds and enum values (compared on their own)."""
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return ("ref", schema["$ref"].rsplit("/", 1)[1])
    if "anyOf" in schema:
        return ("anyOf", tuple(sorted(map(repr, (shape(s) for s in schema["anyOf"])))))
    return (schema.get("type", "enum" if "enum" in schema else "any"), schema.get("format"),
            shape(schema.get("items")), shape(schema.get("additionalProperties")))


def _enum_values(schema: dict[str, Any]) -> set[Any]:
    values = set(schema.get("enum", []))
    for member in schema.get("anyOf", []):
        values |= set(member.get("enum", []))
    return values


def _schemas(previous: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    found = []
    old_all, new_all = previous["components"]["schemas"], current["components"]["schemas"]
    sent, answered = _request_side(current), _response_side(current)
    for name, old in old_all.items():
        new = new_all.get(name)
        if new is None:
            found.append(Change(f"schema {name} is gone", (name,)))
            continue
        for value in sorted(_enum_values(old) - _enum_values(new), key=str):
            found.append(Change(f"{name} no longer takes the value {value!r}", (str(value), f"{name}.{value}")))
        old_props, new_props = old.get("properties", {}), new.get("properties", {})
        old_req, new_req = set(old.get("required", [])), set(new.get("required", []))
        for field, old_field in old_props.items():
            names = (field, f"{name}.{field}")
            new_field = new_props.get(field)
            if new_field is None:
                found.append(Change(f"field {name}.{field} is gone", names))
                continue
            if shape(old_field) != shape(new_field):
                found.append(Change(f"field {name}.{field} changed type: {shape(old_field)} to {shape(new_field)}",
                                    names))
            for value in sorted(_enum_values(old_field) - _enum_values(new_field), key=str):
                found.append(Change(f"field {name}.{field} no longer takes {value!r}", (*names, str(value))))
            if name in sent and field in new_req - old_req:
                found.append(Change(f"field {name}.{field} is now required of a client", names))
            if name in answered and field in old_req - new_req:
                found.append(Change(f"field {name}.{field} is no longer always in an answer", names))
        if name in sent:
            for field in sorted((new_req - old_req) - set(old_props)):
                found.append(Change(f"{name} requires a new field {field}", (field, f"{name}.{field}")))
    return found


def _error_codes(previous: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    found = []
    for code, old in previous.items():
        new = current.get(code)
        if new is None:
            found.append(Change(f"error code {code} is gone", (code,)))
        elif new != old:
            found.append(Change(f"error code {code} changed meaning: {old} to {new}", (code,)))
    return found


def _events(previous: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    found = []
    for tag, old in previous.items():
        new = current.get(tag)
        if new is None:
            found.append(Change(f"event {tag} is gone", (tag, old["class"])))
            continue
        for field, old_field in old["fields"].items():
            names = (field, f"{tag}.{field}", f"{old['class']}.{field}")
            new_field = new["fields"].get(field)
            if new_field is None:
                found.append(Change(f"event field {tag}.{field} is gone", names))
            elif new_field["type"] != old_field["type"]:
                found.append(Change(f"event field {tag}.{field} changed type", names))
        for field, new_field in new["fields"].items():
            if new_field["required"] and not old["fields"].get(field, {}).get("required", False):
                found.append(Change(f"event field {tag}.{field} is now required", (field, f"{tag}.{field}")))
    return found


def _settings(previous: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    found = []
    for env, old in previous.items():
        new = current.get(env)
        if new is None:
            found.append(Change(f"setting {env} is gone", (env,)))
        elif new["type"] != old["type"]:
            found.append(Change(f"setting {env} changed type: {old['type']} to {new['type']}", (env,)))
    return found


def published_by(python: Path, tree: Path) -> dict[str, Any]:
    """What the code in `tree`, run by `python` (its release's interpreter), publishes."""
    # Defaults only: a VIDJOBS_* variable of this shell must not shape the document.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    out = subprocess.run([str(python), "-P", str(EXTRACTOR)], cwd=tree, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{EXTRACTOR.name} failed under {python}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def recorded(version: str) -> dict[str, Any]:
    path = CONTRACTS / f"{version}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path.relative_to(ROOT)} is missing: record it with "
                                f"`python -m tests.contractdiff --record {version}` (docs/RELEASES.md)")
    return json.loads(path.read_text())


def record(version: str) -> Path:
    """Build the release `version` names in CHANGELOG.md from its commit and write what it publishes."""
    from tests.fleet import build_release  # psutil and the cli's supervisor: only the recorder needs them

    release = next((r for r in releases.released(releases.CHANGELOG.read_text()) if r.version == version), None)
    if release is None:
        raise SystemExit(f"CHANGELOG.md has no heading for {version}")
    full = releases.resolve(release.commit)
    if full is None:
        raise SystemExit(f"commit {release.commit} is not in this clone")
    releases.check_tag(release, full)
    with tempfile.TemporaryDirectory() as home:
        built = build_release(full, Path(home) / "release")
        contract = {"release": version, "commit": full, **published_by(built.python, built.source)}
    CONTRACTS.mkdir(parents=True, exist_ok=True)
    path = CONTRACTS / f"{version}.json"
    path.write_text(json.dumps(contract, indent=1, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.contractdiff")
    parser.add_argument("--record", metavar="VERSION", required=True, help="a released version in CHANGELOG.md")
    print(record(parser.parse_args().record), file=sys.stderr)
