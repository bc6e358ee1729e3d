"""docs/SETTINGS.md, every `VIDJOBS_*` setting with its default and meaning, written from `settings.py` itself:
its fields, their defaults and their comments, so the page cannot drift from the code (a test compares them).

    python -m vidjobs.common.settingsdoc > docs/SETTINGS.md

How the comments are read: a field's own meaning is the comment at the end of its line; a comment block above
fields speaks of every field after it up to the next block or blank line, and is printed above their table.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from vidjobs.common import settings

_INTRO = """# Settings

Written from `vidjobs.common.settings` (`python -m vidjobs.common.settingsdoc > docs/SETTINGS.md`); the code is
the authority. Every service and the `vidjobs` command read the same settings from the environment: the field
`http_port` is the variable `VIDJOBS_HTTP_PORT`, and so on. An unknown `VIDJOBS_*` variable is refused at
start, naming it, as is a value of the wrong type. Settings marked JSON take a JSON value; their entries are
described at the end. `vidjobs up` fills in what the embedded stack needs (the data directory's servers,
secrets it generates, the fake provider). Besides these, `VIDJOBS_URL`, `VIDJOBS_API_KEY`, `VIDJOBS_CONFIG` and
`VIDJOBS_PLATFORM_KEY` are read by the client commands and the Python client (where the API is, the key, the
file `vidjobs login` writes, a product's platform key), and the standard `OTEL_*` variables by tracing; none of
them is a service setting.
"""


@dataclass
class Field:
    name: str
    default: str  # as the code writes it
    note: str  # the comment at the end of its line


@dataclass
class Group:
    note: str  # the comment block above the fields, or empty
    fields: list[Field] = field(default_factory=list)


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Comment text by line, and the lines that hold nothing but a comment."""
    text: dict[int, str] = {}
    alone: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            text[line] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                alone.add(line)
    return text, alone


def groups_of(class_name: str, source: str) -> list[Group]:
    """The fields of one class of `source`, in order, grouped under the comment blocks above them."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fields = {n.lineno: n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    last = max(n.end_lineno or n.lineno for n in fields.values())
    comments, alone = _comments(source)
    lines = source.splitlines()
    out: list[Group] = []
    current: Group | None = None
    pending: list[str] = []
    for number in range(cls.body[0].lineno, last + 1):
        if number in alone:
            pending.append(comments[number])
        elif not lines[number - 1].strip():
            current, pending = None, []
        elif number in fields:
            if pending or current is None:
                current = Group(" ".join(pending))
                out.append(current)
                pending = []
            node = fields[number]
            assert isinstance(node.target, ast.Name)
            default = ast.get_source_segment(source, node.value) if node.value is not None else ""
            current.fields.append(Field(node.target.id, default or "", comments.get(number, "")))
    return out


def _default(written: str, value: object) -> str:
    if not written:
        return "required"
    if value is None or value == "":
        return "none" if value is None else "empty"
    shown = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    if written.strip('"').replace("_", "") == shown.replace("_", "") or written.startswith(("{", "[")):
        return f"`{shown}`"
    return f"`{shown}` (`{written}`)"  # what the code writes, `64 * 1024`, says it better than the number


def _table(group: Group, values: object, prefix: str, json_fields: frozenset[str]) -> list[str]:
    lines = [group.note, ""] if group.note else []
    lines += ["| variable | default | meaning |", "|---|---|---|"]
    for f in group.fields:
        kind = " (JSON)" if f.name in json_fields else ""
        name = f"{prefix}{f.name.upper()}" if prefix else f.name
        default = _default(f.default, getattr(values, f.name))
        note = f.note.replace("|", "\\|")  # a bar would end the cell
        lines.append(f"| `{name}`{kind} | {default} | {note} |")
    return [*lines, ""]


def reference() -> str:
    source = Path(settings.__file__).read_text()
    json_fields = frozenset(settings._JSON_FIELDS)
    lines = [_INTRO]
    for group in groups_of("Settings", source):
        lines += _table(group, settings.Settings(), settings.PREFIX, json_fields)
    lines += ["## Entries of the JSON settings", ""]
    for cls, used_by in ((settings.ProviderLimits, "VIDJOBS_PROVIDER_LIMITS"),
                         (settings.ProviderPolicy, "VIDJOBS_RETRY_POLICIES"),
                         (settings.RouteShare, "VIDJOBS_MODEL_ROUTES")):
        lines += [f"### {cls.__name__} (`{used_by}`)", "", (cls.__doc__ or "").strip(), ""]
        for group in groups_of(cls.__name__, source):
            rows = _table(group, _defaults(cls), "", frozenset())
            lines += [r.replace("| variable |", "| field |") for r in rows]
    return "\n".join(line for line in lines).replace("\n\n\n", "\n\n").rstrip() + "\n"


def _defaults(cls: type[msgspec.Struct]) -> object:
    """The class's defaults by field name (a field without one is shown as required, from its source)."""
    info = {f.name: f.default for f in msgspec.structs.fields(cls)}
    return type("Defaults", (), {k: (None if v is msgspec.NODEFAULT else v) for k, v in info.items()})()


if __name__ == "__main__":
    sys.stdout.write(reference())
