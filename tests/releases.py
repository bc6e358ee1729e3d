"""The releases CHANGELOG.md records, and the one before this checkout (docs/RELEASES.md).

A released version's heading names its date and its commit: `## [0.1.0] — 2026-12-03 — commit 737820f`. The
changelog, not the tags, is what a test reads the releases from: a CI clone has the full history but may not
have fetched the tags. Where a tag `vX.Y.Z` is present it must point at the commit the changelog names."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"
UNRELEASED = "## [Unreleased]"
_HEADING = re.compile(r"## \[(?P<version>\d+\.\d+\.\d+)\] — (?P<date>\d{4}-\d{2}-\d{2}) — "
                      r"commit (?P<commit>[0-9a-f]{7,40})")
# A thing a changelog line names: anything in backticks.
_NAMED = re.compile(r"`([^`\n]+)`")


class ReleaseNotFound(Exception):
    """The changelog names a release this clone cannot resolve, or a tag disagrees with it: something to fix
    in the repository or the clone, never a reason to skip a test."""


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    commit: str  # as the changelog spells it (an abbreviation)


def released(text: str) -> list[Release]:
    """Every released version heading, newest first (as the changelog lists them)."""
    found = [_HEADING.fullmatch(line.strip()) for line in text.splitlines() if line.startswith("## [")]
    bad = [line for line in text.splitlines()
           if line.startswith("## [") and line.strip() != UNRELEASED and not _HEADING.fullmatch(line.strip())]
    if bad:
        raise ValueError(f"a version heading must read `## [X.Y.Z] — YYYY-MM-DD — commit <sha>`, not {bad}")
    return [Release(m["version"], m["date"], m["commit"]) for m in found if m is not None]


def unreleased_entries(text: str) -> list[str]:
    """The lines under `## [Unreleased]`, up to the next version heading."""
    lines = text.splitlines()
    if UNRELEASED not in (line.strip() for line in lines):
        raise ValueError(f"the changelog has no `{UNRELEASED}` section")
    start = next(i for i, line in enumerate(lines) if line.strip() == UNRELEASED) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [line for line in lines[start:end] if line.strip()]


def named(lines: list[str]) -> set[str]:
    """What the lines name in backticks."""
    return {name.strip() for line in lines for name in _NAMED.findall(line)}


def git(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ReleaseNotFound("git is not installed: the releases are read from this repository's history") from exc


def resolve(commit: str) -> str | None:
    """The full hash of `commit` in this clone, or None where the clone lacks it."""
    out = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    return out.stdout.strip() if out.returncode == 0 else None


def check_tag(release: Release, full: str) -> None:
    """Where `v<version>` is present, it is on the commit the changelog names."""
    tagged = resolve(f"refs/tags/v{release.version}")
    if tagged is not None and tagged != full:
        raise ReleaseNotFound(f"tag v{release.version} is on {tagged[:12]}, but CHANGELOG.md names commit "
                              f"{release.commit} for {release.version}: one of them is wrong")


def previous_release(text: str | None = None) -> tuple[Release, str]:
    """The release before this checkout, with its full hash: the newest released heading whose commit is not
    the checkout's own (the checkout of a release itself is held to the release before it)."""
    text = CHANGELOG.read_text() if text is None else text
    head = resolve("HEAD")
    for release in released(text):
        full = resolve(release.commit)
        if full is None:
            raise ReleaseNotFound(f"CHANGELOG.md names commit {release.commit} for {release.version}, which is not "
                                  "in this clone: fetch the full history (a shallow clone lacks it), or correct "
                                  "the heading")
        check_tag(release, full)
        if full != head:
            return release, full
    raise ReleaseNotFound("CHANGELOG.md records no release before this checkout")
