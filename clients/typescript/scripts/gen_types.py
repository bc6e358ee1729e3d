"""Write the TypeScript client's types (src/types.gen.ts) from the gateway's OpenAPI document.

    python clients/typescript/scripts/gen_types.py            # from the gateway's code, as docs/API.md is made
    python clients/typescript/scripts/gen_types.py --from http://127.0.0.1:8080/openapi.json
    python clients/typescript/scripts/gen_types.py --check    # exit 1 if src/types.gen.ts is not what it writes

Every schema becomes an exported type (an interface for an object, a union for an enum), its descriptions and
defaults as doc comments. Every `/v1` route a credential may call becomes an entry of `Operations`, keyed
`"METHOD /path"`, naming its path, query and header parameters, its body and its answer; the client's one request
function takes those keys, so a route or a field that changes in the document changes the client's types, and a
route the document drops stops compiling. Only the standard library is needed to turn a document read from a file
or a URL; without `--from` the document is built from the gateway's code (the workspace installed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]
TARGET = PACKAGE / "src" / "types.gen.ts"
_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_PRIMITIVE = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}
# A body that is not JSON (an upload's raw image) is anything fetch can send.
_RAW_BODY = "Blob | ArrayBuffer | ArrayBufferView | ReadableStream<Uint8Array>"
HEADER = """\
// Generated from the gateway's OpenAPI document by scripts/gen_types.py: do not edit by hand.
// Regenerate with `python clients/typescript/scripts/gen_types.py`; a test fails when this file and the
// document differ.
"""


def gateway_document() -> dict[str, Any]:
    """The document as the gateway serves it for a deployment as `vidjobs up` runs it (as docs/API.md is made)."""
    from vidjobs.common.settings import Settings
    from vidjobs.gateway.app import route_table
    from vidjobs.gateway.openapi import document

    return document(route_table(Settings(fake_provider="on")))


def read_document(source: str) -> dict[str, Any]:
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=30) as resp:
            return dict(json.load(resp))
    return dict(json.loads(Path(source).read_text()))


def _comment(lines: list[str], indent: str) -> list[str]:
    lines = [line.replace("*/", "*\\/") for line in lines if line]
    if not lines:
        return []
    if len(lines) == 1:
        return [f"{indent}/** {lines[0]} */"]
    return [f"{indent}/**", *(f"{indent} * {line}" for line in lines), f"{indent} */"]


def _key(name: str) -> str:
    return name if _IDENTIFIER.match(name) else json.dumps(name)


def _description(schema: dict[str, Any]) -> str:
    found = schema.get("description") or next(
        (s["description"] for s in schema.get("anyOf", []) if isinstance(s, dict) and "description" in s), "")
    return str(found)


def _notes(schema: dict[str, Any]) -> list[str]:
    lines = [_description(schema)]
    if "default" in schema and schema["default"] is not None and schema["default"] != {}:
        lines.append(f"@default {json.dumps(schema['default'])}")
    return lines


def ts_type(schema: dict[str, Any], indent: str = "") -> str:
    """The TypeScript type of a JSON Schema (the subset msgspec writes)."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[1]
    if "anyOf" in schema:
        return _union([ts_type(s, indent) for s in schema["anyOf"]])
    if "enum" in schema:
        return _union([json.dumps(v) for v in schema["enum"]])
    if "const" in schema:
        return json.dumps(schema["const"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([ts_type({**schema, "type": k}, indent) for k in kind])
    if kind == "array":
        item = ts_type(schema.get("items", {}), indent)
        return f"({item})[]" if " | " in item else f"{item}[]"
    if kind == "object":
        if "properties" in schema:
            return _object(schema, indent)
        values = schema.get("additionalProperties")
        return f"Record<string, {ts_type(values, indent) if isinstance(values, dict) else 'unknown'}>"
    if isinstance(kind, str) and kind in _PRIMITIVE:
        return _PRIMITIVE[kind]
    return "unknown"


def _union(parts: list[str]) -> str:
    seen: list[str] = []
    for part in parts:
        if part not in seen:
            seen.append(part)
    return " | ".join(seen)


def _object(schema: dict[str, Any], indent: str) -> str:
    inner = indent + "  "
    required = set(schema.get("required", []))
    lines = ["{"]
    for name, prop in schema["properties"].items():
        lines += _comment(_notes(prop), inner)
        lines.append(f"{inner}{_key(name)}{'' if name in required else '?'}: {ts_type(prop, inner)};")
    return "\n".join([*lines, indent + "}"])


def _declaration(name: str, schema: dict[str, Any]) -> list[str]:
    lines = _comment([schema.get("description", "")], "")
    if schema.get("type") == "object" and "properties" in schema:
        return [*lines, f"export interface {name} {_object(schema, '')}"]
    return [*lines, f"export type {name} = {ts_type(schema)};"]


def _parameters(params: list[dict[str, Any]], where: str) -> str:
    chosen = [p for p in params if p["in"] == where]
    if not chosen:
        return "{}"
    lines = ["{"]
    for p in chosen:
        lines += _comment([p.get("description") or _description(p["schema"])], "      ")
        optional = "" if p.get("required") else "?"
        lines.append(f"      {_key(p['name'])}{optional}: {ts_type(p['schema'], '      ')};")
    return "\n".join([*lines, "    }"])


def _body(op: dict[str, Any]) -> str:
    body = op.get("requestBody")
    if not body:
        return "never"
    content = body.get("content", {})
    if "application/json" in content:
        found = ts_type(content["application/json"]["schema"], "    ")
    else:
        found = _RAW_BODY
    return found if body.get("required", True) else f"{found} | undefined"


def _answer(op: dict[str, Any]) -> tuple[str, str | None]:
    """The type a success answers, and the type of each event when it answers a stream of them."""
    for status, answer in op["responses"].items():
        if not status.startswith("2"):
            continue
        for media, spec in answer.get("content", {}).items():
            if media == "application/json":
                return ts_type(spec["schema"]), None
            if media == "text/event-stream":
                return "never", ts_type(spec.get("itemSchema", {}))
        return "void", None
    return "void", None


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The routes a client calls: every `/v1` route that takes a credential (not a provider's callbacks, nor the
    operator's and the page's own routes)."""
    return [(method.upper(), path, op) for path, ops in doc["paths"].items() for method, op in ops.items()
            if path.startswith("/v1/") and op.get("security")]


def render(doc: dict[str, Any]) -> str:
    out = [HEADER]
    for name, schema in sorted(doc["components"]["schemas"].items()):
        out += [*_declaration(name, schema), ""]
    out.append("/** Every route a credential may call, keyed `METHOD /path`: what it takes and what it answers. */")
    out.append("export interface Operations {")
    for method, path, op in operations(doc):
        answer, event = _answer(op)
        params = op.get("parameters", [])
        access = json.dumps(op.get("x-vidjobs-access", {}), sort_keys=True)
        out += _comment([op.get("summary", ""), f"`{op['operationId']}`; who may call it: {access}"], "  ")
        out.append(f"  {json.dumps(f'{method} {path}')}: {{")
        out.append(f"    operationId: {json.dumps(op['operationId'])};")
        out.append(f"    path: {_parameters(params, 'path')};")
        out.append(f"    query: {_parameters(params, 'query')};")
        out.append(f"    headers: {_parameters(params, 'header')};")
        out.append(f"    body: {_body(op)};")
        out.append(f"    response: {answer};")
        if event is not None:
            out.append(f"    event: {event};")
        out.append("  };")
    out += ["}", "", "/** A route of the API, as `Operations` keys it. */", "export type Route = keyof Operations;", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", help="a file or URL of the document (default: the gateway's code)")
    parser.add_argument("--check", action="store_true", help="only say whether the file is up to date")
    parser.add_argument("--out", type=Path, default=TARGET)
    args = parser.parse_args(argv)
    text = render(read_document(args.source) if args.source else gateway_document())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            sys.stderr.write(f"{args.out} differs from the OpenAPI document: regenerate it\n")
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
