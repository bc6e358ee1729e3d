"""The repository explains itself: every document a file cites is in the repository, a citation of a section
(`docs/ARCHITECTURE.md "Recovery"`) names a section that document has, and nothing points at documents kept
outside the repository, which a reader of a checkout or an installed package never has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Spelled in pieces so that this file does not itself name what it forbids: documents kept beside the
# checkout, which do not ship with it, by relative and by absolute path.
OUTSIDE = ("../" + "shared", "/work/" + "shared")

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sql", ".js", ".html", ".css", ".json", ".txt", ".sh",
                 ".cfg", ".ini", ".j2", ".conf"}
SKIPPED_DIRS = {".venv", ".git", "__pycache__", "node_modules", ".vidjobs", ".ruff_cache", ".mypy_cache"}

# `name.md`, a path to one, optionally followed by the sections it cites: `FILE.md "A", "B"`. A name inside a
# string literal (`"API.md"`, a path being built) is code, not a citation, and a URL is not a file here.
_CITATION = re.compile(r"""(?<!["'\w./-])((?:[\w.-]+/)*[\w.-]*\w\.md)\b((?:,?\s+"[^"\n]{1,80}")*)""")
_SECTION = re.compile(r'"([^"\n]+)"')
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")


def repository_files() -> list[Path]:
    """The files of the checkout, tracked or new, as git sees them (ignored files left out); every text file
    under the root when there is no git."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        paths = [ROOT / name for name in out.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)]
    here = Path(__file__).resolve()  # its own examples of broken citations are what it checks for
    return sorted(p for p in paths if p.is_file() and p.resolve() != here
                  and (p.suffix in TEXT_SUFFIXES or p.name == "Dockerfile"))


def sections(document: Path) -> set[str]:
    """What a citation may name in a document: its headings, and the bold lead of a paragraph or list item
    (`- **Why 4 at most.** ...`), each also up to a parenthesis or colon (`## Recovery (callback first)`)."""
    names = set()
    for line in document.read_text().splitlines():
        heading = re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)
        lead = re.match(r"\s*(?:[-*]\s+)?\*\*(.+?)\*\*", line)
        for found in (heading, lead):
            if found:
                text = found.group(1).strip().rstrip(".:")
                names |= {text, re.split(r"\s*[(:]", text, maxsplit=1)[0].strip()}
    return names


def citations(text: str) -> list[tuple[str, list[str]]]:
    """Each cited document in `text` with the sections cited with it."""
    text = _URL.sub(" ", text)
    return [(m.group(1), _SECTION.findall(m.group(2))) for m in _CITATION.finditer(text)]


def resolve(cited: str, citing: Path, root: Path) -> Path | None:
    """A citation names a file from the repository's root or from the citing file's own folder."""
    for base in (root, citing.parent):
        path = (base / cited).resolve()
        if path.is_file() and path.is_relative_to(root):
            return path
    return None


def broken_citations(files: list[Path], root: Path = ROOT) -> list[str]:
    broken = []
    for path in files:
        where = path.relative_to(root)
        for cited, named in citations(path.read_text(errors="replace")):
            target = resolve(cited, path, root)
            if target is None:
                broken.append(f"{where}: cites {cited}, which is not in the repository")
                continue
            missing = [n for n in named if n not in sections(target)]
            if missing:
                broken.append(f"{where}: cites {cited} {missing}, which it has no section for")
    return broken


def test_nothing_points_outside_the_repository():
    found = [f"{p.relative_to(ROOT)}: {outside}" for p in repository_files() for outside in OUTSIDE
             if outside in p.read_text(errors="replace")]
    assert not found, f"these point outside the repository: {found}"


def test_every_cited_document_and_section_is_in_the_repository():
    broken = broken_citations(repository_files())
    assert not broken, "\n".join(broken)


def test_the_citation_check_sees_what_it_must(tmp_path):
    """The checks above find broken citations, and leave code that merely builds a path alone."""
    assert citations('see (docs/ARCHITECTURE.md "Job states", "Recovery") and README.md') == [
        ("docs/ARCHITECTURE.md", ["Job states", "Recovery"]), ("README.md", [])]
    assert citations('Path("docs") / "API.md"; https://example.com/docs/RUNBOOK.md') == []
    doc = tmp_path / "GUIDE.md"
    doc.write_text("# Guide\n## Recovery (the slow path)\n- **Why 4 at most.** because\n")
    assert sections(doc) >= {"Recovery", "Why 4 at most", "Guide"}
    citing = tmp_path / "code.py"
    citing.write_text('# GUIDE.md "Recovery", GUIDE.md "Why 4 at most"; GUIDE.md "Shape"; GONE.md\n')
    assert broken_citations([citing], tmp_path) == [
        "code.py: cites GUIDE.md ['Shape'], which it has no section for",
        "code.py: cites GONE.md, which is not in the repository"]


def _table_keys(document: Path, heading: str) -> set[str]:
    """The names in the first column (`name`) of the tables under a `## heading` of a document."""
    text = document.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))


def test_the_fake_provider_page_names_every_scenario_parameter_and_counter():
    from vidjobs.fakeprovider.wire import Counters, RenderParams, Scenario
    from vidjobs.providers.fake.adapter import PARAM_CHECKS, SCENARIOS

    page = ROOT / "docs" / "FAKE_PROVIDER.md"
    assert _table_keys(page, "Scenarios") == {s.value for s in Scenario} == set(SCENARIOS)
    assert _table_keys(page, "Parameters") == set(RenderParams.__struct_fields__) == set(PARAM_CHECKS)
    assert set(Counters.__struct_fields__) <= _table_keys(page, "Its HTTP API")


def test_the_architecture_page_has_every_legal_move_and_no_other():
    """docs/ARCHITECTURE.md "Job states" lists the moves `states.LEGAL` allows: rows name several statuses as
    `a, b` (from) or `a / b` (to), and `any non-terminal`."""
    from vidjobs.common.states import LEGAL, NON_TERMINAL, JobStatus

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("\n## Job states\n", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for src, to in re.findall(r"^\| ([a-z, -]+) \| ([a-z /]+) \|", text, flags=re.MULTILINE)[1:]:  # header
        sources = NON_TERMINAL if src == "any non-terminal" else {JobStatus(s) for s in src.split(", ")}
        documented |= {(s, JobStatus(t)) for s in sources for t in to.split(" / ")}
    assert documented == {(src, to) for src, targets in LEGAL.items() for to in targets}
